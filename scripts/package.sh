#!/usr/bin/env bash
# Builds the release packages of the PostgreSQL majors in PG_MAJORS (default 15), each
# into target/package/:
#   postgresql-<major>-snowflake_<version>-1_<arch>.deb   (sudo apt-get install ./FILE)
#   snowflake-<version>-pg<major>-<arch>.tar.gz           (the same files, for tar -C / where there is no dpkg)
# The files sit at the paths of that major's pg_config (PGDG's layout on Debian and Ubuntu);
# the package's Depends is postgresql-<major> plus the shared libraries the library links.
# Installs what building needs first (SETUP_FOR=build scripts/setup.sh: Debian's build
# packages, and for 16-18 a local build of that PostgreSQL installed as postgresql-<major>).
# It builds in this checkout's target/ (about 1 GB), whatever CARGO_TARGET_DIR says.
# See docs/install.md.
#   scripts/package.sh                         PostgreSQL 15
#   PG_MAJORS="15 16 17 18" scripts/package.sh   every supported major
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
majors="${PG_MAJORS:-15}"
PG_MAJORS="$majors" SETUP_FOR=build "$REPO_ROOT/scripts/setup.sh"
for major in $majors; do
    (
        use_major "$major"
        source "$REPO_ROOT/scripts/packaging.sh"
        package_extension
    )
done
