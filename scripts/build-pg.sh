#!/usr/bin/env bash
# Builds PostgreSQL 16, 17, 18 or 19 from a source package into /opt/snowflake-pg/<major>,
# once: a second run finds the installed pg_config and returns at once. Debian 12 ships only
# PostgreSQL 15, and newer binary packages need a newer glibc, hence the source build.
#   16: Ubuntu 24.04 (noble-updates); Debian no longer carries 16 in any suite.
#   17: Debian trixie.  18: Debian sid.  19: Debian experimental.
# Every download is verified: apt checks the suite's signed Release file against the
# archive keyring and each file against the hashes it lists. Debian's keyring comes with
# the system; Ubuntu's comes from Debian's ubuntu-keyring package, itself verified that way.
#   scripts/build-pg.sh 16|17|18|19
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

major="$1"
prefix="$(pg_prefix_of "$major")"
if [ -x "$prefix/bin/pg_config" ]; then
    exit 0
fi

debian_mirror="$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)"
debian_mirror="${debian_mirror:-http://deb.debian.org/debian}"
debian_keyring=/usr/share/keyrings/debian-archive-keyring.gpg
work="/var/tmp/snowflake-pg-src/$major"
rm -rf "$work"
mkdir -p "$work"

# apt_private NAME LINE: runs apt-get with a private configuration holding only LINE.
apt_private() {
    local name="$1" line="$2"
    shift 2
    mkdir -p "$work/$name/lists/partial" "$work/$name/cache/archives/partial"
    echo "$line" >"$work/$name/sources.list"
    apt-get -o "Dir::Etc::sourcelist=$work/$name/sources.list" -o "Dir::Etc::sourceparts=-" \
        -o "Dir::State::Lists=$work/$name/lists" -o "Dir::Cache=$work/$name/cache" \
        -o "APT::Sandbox::User=root" "$@"
}

case "$major" in
    16)
        # Ubuntu's archive key, from Debian's (verified) ubuntu-keyring package.
        keyring_line="deb [signed-by=$debian_keyring] $debian_mirror trixie main"
        apt_private keyring "$keyring_line" update -qq
        (cd "$work" && apt_private keyring "$keyring_line" download -qq ubuntu-keyring)
        dpkg-deb --fsys-tarfile "$work"/ubuntu-keyring_*.deb |
            tar -xO ./usr/share/keyrings/ubuntu-archive-keyring.gpg >"$work/ubuntu-archive-keyring.gpg"
        source_line="deb-src [signed-by=$work/ubuntu-archive-keyring.gpg] http://archive.ubuntu.com/ubuntu noble-updates main"
        ;;
    17) source_line="deb-src [signed-by=$debian_keyring] $debian_mirror trixie main" ;;
    18) source_line="deb-src [signed-by=$debian_keyring] $debian_mirror sid main" ;;
    19) source_line="deb-src [signed-by=$debian_keyring] $debian_mirror experimental main" ;;
    *) echo "build-pg.sh: unsupported major $major" >&2; exit 2 ;;
esac

log "Building PostgreSQL $major from its source package (${source_line#*] }), about 4 minutes"
for pkg in dpkg-dev libreadline-dev zlib1g-dev bison flex; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null
done

apt_private source "$source_line" update -qq
# apt-get source verifies the .dsc and the tarballs against the signed index.
(cd "$work" && apt_private source "$source_line" source --download-only -qq "postgresql-$major")
dsc="$(ls "$work"/postgresql-"$major"_*.dsc | sort -V | tail -1)"
# dpkg-source checks the hashes again; it cannot check the uploader's own signature (that
# needs debian-keyring) and says so, which is fine: the archive's signature covers the files.
(cd "$work" && dpkg-source -x "$dsc" src >/dev/null 2>"$work/dpkg-source.log") || {
    cat "$work/dpkg-source.log" >&2
    exit 1
}

cd "$work/src"
./configure --prefix="$prefix" --without-icu >/dev/null
make -j"$(nproc)" -s >/dev/null
make -s install >/dev/null
# Client tools used by the tests (pgbench, pg_basebackup) live under src/bin and are installed above.
rm -rf "$work"
log "PostgreSQL $major installed in $prefix"
