#!/usr/bin/env bash
# The release rule, checked: a released SQL script is never edited, and every released
# version can be updated to the current one.
#   - sql/released.sha256 pins the checksum of every released script in sql/;
#   - from every released version there is a chain of sql/snowflake--A--B.sql scripts to the
#     version in Cargo.toml.
# At a release: add the new upgrade script's checksum to sql/released.sha256.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT/sql"

sha256sum --quiet --strict -c released.sha256
current="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -1)"

# Every version that appears in a released script name.
versions="$(awk '{print $2}' released.sha256 | sed -n 's/^snowflake--\(.*\)\.sql$/\1/p' | tr -s '-' '\n' | sort -u)"
for v in $versions; do
    at="$v"
    for _ in $(seq 1 50); do
        [ "$at" = "$current" ] && break
        next="$(ls snowflake--"$at"--*.sql 2>/dev/null | sed -n "s/^snowflake--$at--\(.*\)\.sql$/\1/p" | sort -V | tail -1)"
        if [ -z "$next" ]; then
            echo "check-released: no upgrade path from $v to $current (stuck at $at)" >&2
            exit 1
        fi
        at="$next"
    done
done
echo "check-released: released scripts unchanged; every released version updates to $current"
