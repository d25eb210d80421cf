#!/usr/bin/env bash
# Builds the packages of one PostgreSQL major (default 15; PG_MAJORS=17 for 17), release:
#   target/package/postgresql-<major>-snowflake_<version>-1_<arch>.deb   (apt-get install ./FILE)
#   target/package/snowflake-<version>-pg<major>-<arch>.tar.gz           (the same files, for tar -C /)
# The files sit at the paths of that major's pg_config (PGDG's layout on Debian and Ubuntu).
# The package's Depends is postgresql-<major> plus the shared libraries the library links.
# See docs/install.md.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
use_major "${PG_MAJORS:-${PG_MAJOR:-15}}"
source "$REPO_ROOT/scripts/packaging.sh"
PG_MAJORS="$PG_MAJOR" "$REPO_ROOT/scripts/setup.sh"
deb="$(package_extension)"
echo "$deb"
