#!/usr/bin/env bash
# The linters of the Python and the shell (scripts/test.sh runs this; scripts/setup.sh
# installs both): ruff over the Python of tests/, scripts/ and bench/ (ruff.toml), then
# every shell script of the repository through ShellCheck (.shellcheckrc).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

"$RUFF_DIR/bin/ruff" check --no-cache --quiet

shell=(scripts/*.sh .ci/run)
while IFS= read -r f; do shell+=("$f"); done < <(git ls-files 'packaging/*.sh')
shellcheck "${shell[@]}"
