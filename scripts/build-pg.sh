#!/usr/bin/env bash
# Builds PostgreSQL 16, 17, 18 or 19 from a source package and installs it as a Debian
# package of its own, postgresql-<major> (version <source version>+snowflake<N>), laid out
# like the PGDG packages: /usr/lib/postgresql/<major>/{bin,lib}, /usr/share/postgresql/<major>,
# /usr/include/postgresql/<major>/server. So the extension's .deb for that major installs at
# the paths a PGDG server reads, and its `Depends: postgresql-<major>` is met the way it is on
# a user's machine. Once: a second run finds the package installed and returns at once.
# Debian 12 ships only PostgreSQL 15, and newer binary packages need a newer glibc, hence the
# source build. The .deb is kept in /var/cache/snowflake-pg for a reinstall.
#   16: Ubuntu 24.04 (noble-updates); Debian no longer carries 16 in any suite.
#   17: Debian trixie.  18: Debian sid.  19: Debian experimental.
# Every download is verified: apt checks the suite's signed Release file against the
# archive keyring and each file against the hashes it lists. Debian's keyring comes with
# the system; Ubuntu's comes from Debian's ubuntu-keyring package, itself verified that way.
# No archive host is named here: Debian's mirror is the one the machine's apt configuration
# uses, and Ubuntu's the one Debian's debootstrap package uses for Ubuntu (or
# SNOWFLAKE_UBUNTU_MIRROR).
#   scripts/build-pg.sh 16|17|18|19
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

major="$1"
prefix="$(pg_prefix_of "$major")"
# Bumped when the build or the layout changes, so that machines rebuild.
BUILD_REVISION=snowflake2
installed_version="$(dpkg-query -W -f='${Status} ${Version}' "postgresql-$major" 2>/dev/null || true)"
if [[ "$installed_version" == "install ok installed "*"+$BUILD_REVISION" ]] && [ -x "$prefix/bin/pg_config" ]; then
    exit 0
fi
cache=/var/cache/snowflake-pg
cached="$(ls "$cache"/postgresql-"$major"_*+"$BUILD_REVISION"_*.deb 2>/dev/null | sort -V | tail -1 || true)"
if [ -n "$cached" ]; then
    log "Installing PostgreSQL $major from $cached"
    DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y -qq "$cached" >/dev/null
    exit 0
fi

# The machine's Debian mirror: the first archive (not -security) its apt sources name, in
# deb822 files or one-line lists.
debian_mirror="$( { awk '/^URIs:/ {for (i = 2; i <= NF; i++) print $i}' /etc/apt/sources.list.d/*.sources 2>/dev/null
                    awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) {print $i; break}}' \
                        /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null; } |
                  grep -E '/debian/?$' | head -1 | sed 's:/*$::' || true)"
if [ -z "$debian_mirror" ]; then
    echo "build-pg.sh: no Debian archive in the machine's apt sources (/etc/apt/sources.list*)" >&2
    exit 1
fi
debian_keyring=/usr/share/keyrings/debian-archive-keyring.gpg
work="/var/tmp/snowflake-pg-src/$major"
rm -rf "$work"
mkdir -p "$work"

# ubuntu_mirror: SNOWFLAKE_UBUNTU_MIRROR, else the amd64 default of debootstrap's Ubuntu
# script, read from Debian's debootstrap package (downloaded and verified by apt, not installed).
ubuntu_mirror() {
    if [ -n "${SNOWFLAKE_UBUNTU_MIRROR:-}" ]; then
        echo "${SNOWFLAKE_UBUNTU_MIRROR%/}"
        return
    fi
    (cd "$work" && apt-get -o APT::Sandbox::User=root download -qq debootstrap >/dev/null)
    dpkg-deb --fsys-tarfile "$work"/debootstrap_*.deb |
        tar -xO ./usr/share/debootstrap/scripts/gutsy |
        awk '$1 == "default_mirror" && $2 ~ /\/ubuntu$/ && $2 !~ /old-releases|ports/ && !found {print $2; found = 1}'
}

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

# Fallback when the suite's index names a version whose files the mirror does not serve
# (seen on 2026-11-23: trixie listed postgresql-17 17.12 while the mirror answered 404 for
# it, and still served 17.11): a known version, fetched from the pool by name and checked
# against SHA-256 sums pinned here. The sums come from the archives' signed indexes when
# each version was current (17.11's .dsc also checks out against debian-keyring: signed by
# Christoph Berg). Format: base URL, then "file sha256" for the .dsc and its tarballs.
# shellcheck disable=SC2034 # read through a nameref in fetch_pinned
pinned_16=("UBUNTU_MIRROR/pool/main/p/postgresql-16"
    "postgresql-16_16.15-0ubuntu0.24.04.1.dsc b0efc56f3d6530672eef604e4b0fc4637892b563d319e571d70de5e49d254ffd"
    "postgresql-16_16.15.orig.tar.gz 4f200ca23dfb120ff9838f13ce06014aad1d3c432d16ee9f93ab2000c0eeef7b"
    "postgresql-16_16.15-0ubuntu0.24.04.1.debian.tar.xz 8a7e856540a2722259d1c43948e8d810fba8ce9bfe161fb686b537adce9be652")
# shellcheck disable=SC2034 # read through a nameref in fetch_pinned
pinned_17=("$debian_mirror/pool/main/p/postgresql-17"
    "postgresql-17_17.11-0+deb13u1.dsc bf148ae423a982707c3f60672c3a072ef62b701bd9f5df847d9f4b8c9b3e3b18"
    "postgresql-17_17.11.orig.tar.bz2 dd27f2b3c59e73ed14aa3324901242bf69a032a6347805f274e6260322d42979"
    "postgresql-17_17.11-0+deb13u1.debian.tar.xz 82851f4dfeb372c99b94b412e2e3046a8eee7771098e42ac1fa234bef2611cbd")
# shellcheck disable=SC2034 # read through a nameref in fetch_pinned
pinned_18=("$debian_mirror/pool/main/p/postgresql-18"
    "postgresql-18_18.6-3.dsc a4254c4548ebeea683832de193460ee8a9f1271418e884803b44ded1aead1776"
    "postgresql-18_18.6.orig.tar.bz2 555610c24d53e4316da5b7d3fc25c279d96856d5e0e23ee308c328c5fa881d9f"
    "postgresql-18_18.6-3.debian.tar.xz 5efd00aa59930757931d13e3b2a343b5ac983fdf646a54a3b96caa30cb40512b")

# fetch_pinned: downloads the pinned source of $major into $work and checks every file.
fetch_pinned() {
    local -n pinned="pinned_$major"
    local base="${pinned[0]/UBUNTU_MIRROR/${ubuntu:-}}" entry file sum
    for entry in "${pinned[@]:1}"; do
        file="${entry% *}"
        sum="${entry#* }"
        curl -fsS --retry 3 -o "$work/$file" "$base/${file//+/%2b}"
        echo "$sum  $work/$file" | sha256sum -c --quiet -
    done
}

case "$major" in
    16)
        # Ubuntu's archive key, from Debian's (verified) ubuntu-keyring package.
        keyring_line="deb [signed-by=$debian_keyring] $debian_mirror trixie main"
        apt_private keyring "$keyring_line" update -qq
        (cd "$work" && apt_private keyring "$keyring_line" download -qq ubuntu-keyring)
        dpkg-deb --fsys-tarfile "$work"/ubuntu-keyring_*.deb |
            tar -xO ./usr/share/keyrings/ubuntu-archive-keyring.gpg >"$work/ubuntu-archive-keyring.gpg"
        ubuntu="$(ubuntu_mirror)"
        if [ -z "$ubuntu" ]; then
            echo "build-pg.sh: no Ubuntu mirror (set SNOWFLAKE_UBUNTU_MIRROR)" >&2
            exit 1
        fi
        source_line="deb-src [signed-by=$work/ubuntu-archive-keyring.gpg] $ubuntu noble-updates main"
        ;;
    17) source_line="deb-src [signed-by=$debian_keyring] $debian_mirror trixie main" ;;
    18) source_line="deb-src [signed-by=$debian_keyring] $debian_mirror sid main" ;;
    19) source_line="deb-src [signed-by=$debian_keyring] $debian_mirror experimental main" ;;
    *) echo "build-pg.sh: unsupported major $major" >&2; exit 2 ;;
esac

log "Building PostgreSQL $major from its source package (${source_line#*] }), about 4 minutes"
for pkg in dpkg-dev libreadline-dev zlib1g-dev bison flex; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
        DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends "$pkg" >/dev/null
done

apt_private source "$source_line" update -qq
# apt-get source verifies the .dsc and the tarballs against the signed index.
if ! (cd "$work" && apt_private source "$source_line" source --download-only -qq "postgresql-$major"); then
    if ! declare -p "pinned_$major" >/dev/null 2>&1; then
        echo "build-pg.sh: the source of postgresql-$major cannot be downloaded" >&2
        exit 1
    fi
    log "The mirror does not serve the indexed postgresql-$major; using the pinned version instead"
    rm -f "$work"/postgresql-"$major"_*
    fetch_pinned
fi
dsc="$(ls "$work"/postgresql-"$major"_*.dsc | sort -V | tail -1)"
# dpkg-source checks the hashes again; it cannot check the uploader's own signature (that
# needs debian-keyring) and says so, which is fine: the archive's signature covers the files.
(cd "$work" && dpkg-source -x "$dsc" src >/dev/null 2>"$work/dpkg-source.log") || {
    cat "$work/dpkg-source.log" >&2
    exit 1
}

cd "$work/src"
# PGDG's paths (Debian's own patches keep pkglibdir at /usr/lib/postgresql/<major>/lib).
./configure --prefix="$prefix" --datadir="/usr/share/postgresql/$major" \
    --includedir=/usr/include/postgresql --without-icu >/dev/null
make -j"$(nproc)" -s >/dev/null
# Client tools used by the tests (pgbench, pg_basebackup) live under src/bin and are installed too.
stage="$work/stage"
make -s install DESTDIR="$stage" >/dev/null
# The client headers (libpq-fe.h, ...) directly under /usr/include/postgresql belong to
# Debian's libpq-dev: keep only this major's server headers (/usr/include/postgresql/<major>).
find "$stage/usr/include/postgresql" -mindepth 1 -maxdepth 1 ! -name "$major" -exec rm -rf {} +

source_version="$(sed -n 's/^Version: //p' "$dsc")"
version="${source_version}+$BUILD_REVISION"
mkdir -p "$stage/DEBIAN"
depends="$(shlib_depends -l"$stage$prefix/lib" "$stage$prefix"/bin/* "$stage$prefix"/lib/*.so*)"
cat >"$stage/DEBIAN/control" <<CONTROL
Package: postgresql-$major
Version: $version
Architecture: $(dpkg --print-architecture)
Maintainer: snowflake developers <snowflake@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: $depends
Section: database
Priority: optional
Description: PostgreSQL $major server, clients and server headers (local build)
 Built by snowflake's scripts/build-pg.sh from the source package
 postgresql-$major $source_version, for building and testing the extension: Debian 12 has
 no PostgreSQL $major. Laid out like the PGDG packages: $prefix,
 /usr/share/postgresql/$major and /usr/include/postgresql/$major/server.
CONTROL
mkdir -p "$cache"
deb="$cache/postgresql-${major}_${version}_$(dpkg --print-architecture).deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -o DPkg::Lock::Timeout=600 -y -qq "$deb" >/dev/null
if [ "$("$prefix/bin/pg_config" --sharedir)" != "/usr/share/postgresql/$major" ] ||
    [ ! -f "$("$prefix/bin/pg_config" --includedir-server)/postgres.h" ]; then
    echo "build-pg.sh: PostgreSQL $major's pg_config does not report PGDG's layout" >&2
    exit 1
fi
cd /
rm -rf "$work"
# Builds before this layout lived in /opt/snowflake-pg/<major>.
rm -rf "/opt/snowflake-pg/$major"
rmdir /opt/snowflake-pg 2>/dev/null || true
log "PostgreSQL $major installed from $deb"
