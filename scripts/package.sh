#!/usr/bin/env bash
# Builds the installable tarball for one PostgreSQL major (default 15; PG_MAJORS=17 for 17).
# Output: target/package/snowflake-<version>-pg<major>-<arch>.tar.gz, to unpack over / on a
# server with the same pg_config layout (see README, "Install on your own server").
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
use_major "${PG_MAJORS:-${PG_MAJOR:-15}}"
PG_MAJORS="$PG_MAJOR" "$REPO_ROOT/scripts/setup.sh"
package_extension
