#!/usr/bin/env bash
# The container's install step, in the official postgres image: installs the extension's
# package from DIR with apt (its Depends: postgresql-<major>, which the image has), makes
# every cluster the image initializes preload the library, and adds initdb-snowflake.sh to
# the scripts the image runs on an empty data directory.
#   install-image.sh DIR     (CONF_SAMPLE and INITDB_DIR override the image's paths, for tests)
set -euo pipefail
dir="$1"
sample="${CONF_SAMPLE:-/usr/share/postgresql/postgresql.conf.sample}"
initdb_dir="${INITDB_DIR:-/docker-entrypoint-initdb.d}"
if [ -z "${SKIP_APT:-}" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$dir"/postgresql-*-snowflake_*.deb
    rm -rf /var/lib/apt/lists/*
fi
# The image's initdb copies this sample into every new data directory.
sed -ri "s/^#?shared_preload_libraries\s*=.*/shared_preload_libraries = 'snowflake'/" "$sample"
grep -qx "shared_preload_libraries = 'snowflake'" "$sample"
install -d "$initdb_dir"
install -m 755 "$dir/initdb-snowflake.sh" "$initdb_dir/50-snowflake.sh"
