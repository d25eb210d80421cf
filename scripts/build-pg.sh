#!/usr/bin/env bash
# Builds PostgreSQL 17 or 18 from Debian's source package into /opt/snowflake-pg/<major>,
# once: a second run finds the installed pg_config and returns at once. Debian 12 ships only
# PostgreSQL 15, and trixie/sid binary packages need a newer glibc, hence the source build.
#   scripts/build-pg.sh 17|18
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

major="$1"
prefix="/opt/snowflake-pg/$major"
if [ -x "$prefix/bin/pg_config" ]; then
    exit 0
fi
case "$major" in
    17) suite=trixie ;;
    18) suite=sid ;;
    *) echo "build-pg.sh: unsupported major $major" >&2; exit 2 ;;
esac

log "Building PostgreSQL $major from Debian's source package ($suite), about 4 minutes"
for pkg in dpkg-dev libreadline-dev zlib1g-dev bison flex; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
done

# The machine's own Debian mirror, with a private apt configuration for the deb-src line.
mirror="$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
mirror="${mirror:-http://deb.debian.org/debian}"
work="/var/tmp/snowflake-pg-src/$major"
rm -rf "$work"
mkdir -p "$work/lists/partial"
echo "deb-src [trusted=yes] $mirror $suite main" >"$work/sources.list"
apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$work/lists" -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" update -qq
(cd "$work" && apt-get "${apt_opts[@]}" source --download-only -qq "postgresql-$major")
dsc="$(ls "$work"/postgresql-"$major"_*.dsc | head -1)"
(cd "$work" && dpkg-source --no-check -x "$dsc" src >/dev/null)

cd "$work/src"
./configure --prefix="$prefix" --without-icu >/dev/null
make -j"$(nproc)" -s >/dev/null
make -s install >/dev/null
# Client tools used by the tests (pgbench, pg_basebackup) live under src/bin and are installed above.
rm -rf "$work"
log "PostgreSQL $major installed in $prefix"
