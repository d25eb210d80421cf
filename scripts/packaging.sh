# shellcheck shell=bash
# The extension's packages: a Debian package per PostgreSQL major
# (postgresql-<major>-snowflake_<version>-1_<arch>.deb) and a tarball of the same files.
# Source it after lib.sh, with use_major done; do not run it.

# Who the packages name as maintainer. A release sets SNOWFLAKE_DEB_MAINTAINER; the default
# is a placeholder (example.org is reserved for examples).
DEB_MAINTAINER="${SNOWFLAKE_DEB_MAINTAINER:-snowflake developers <snowflake@example.org>}"
# Released packages are kept here by commit, major and packaging: a release's code never
# changes, but the packaging that wraps it may (packaging_digest).
RELEASE_CACHE=/var/cache/snowflake-packages

deb_name() { echo "postgresql-${PG_MAJOR}-snowflake"; }

# build_package_tree TREE TARGET: builds the extension from the source tree TREE for this
# major (release; `cargo pgrx package` with CARGO_TARGET_DIR=TARGET), adds TREE's frozen
# install scripts, its CHANGELOG and README, and the copyright file: this project's, plus the
# copyright and license of every crate TREE's library links (scripts/debian-copyright.py).
# Prints the root of the files, laid out at the paths of this major's pg_config.
build_package_tree() {
    local tree="$1" target="$2" root doc
    root="$target/release/snowflake-pg${PG_MAJOR}"
    # cargo pgrx package adds to what is there: a tree packaged earlier (another version)
    # would leave its files in the package.
    rm -rf "$root"
    log "Building the extension (release) from $tree for PostgreSQL ${PG_MAJOR}" >&2
    # PGRX_PG_CONFIG_PATH: no `cargo pgrx init` needed (a container's build stage has none).
    (cd "$tree" && CARGO_TARGET_DIR="$target" PGRX_PG_CONFIG_PATH="$PG_CONFIG" \
        cargo pgrx package --pg-config "$PG_CONFIG" --no-default-features --features "pg${PG_MAJOR}" >&2)
    install_released_scripts "$root$("$PG_CONFIG" --sharedir)/extension" "$tree"
    # The secondary control files (earlier versions are for superusers only: docs/upgrades.md),
    # which cargo pgrx does not copy. A tree of a release before 0.7.0 has none.
    if compgen -G "$tree/sql/snowflake--*.control" >/dev/null; then
        install -m 644 "$tree"/sql/snowflake--*.control "$root$("$PG_CONFIG" --sharedir)/extension/"
    fi
    doc="$root/usr/share/doc/$(deb_name)"
    install -d "$doc"
    install -m 644 "$tree/README.md" "$doc/README.md"
    install -m 644 "$tree/CHANGELOG.md" "$doc/changelog"
    (cd "$tree" && "$REPO_ROOT/scripts/debian-copyright.py" --manifest-path "$tree/Cargo.toml" \
        --features "pg${PG_MAJOR}" --project "$REPO_ROOT/packaging/debian/copyright" \
        --licenses "$REPO_ROOT/packaging/debian/licenses" \
        --overrides "$REPO_ROOT/packaging/debian/crate-overrides") >"$doc/copyright"
    chmod 644 "$doc/copyright"
    echo "$root"
}

# make_deb ROOT VERSION OUT_DIR TREE: the Debian package of the files under ROOT, version
# VERSION-1, written into OUT_DIR. Its dates are TREE's last commit's (SOURCE_DATE_EPOCH when
# set, or when TREE is not a git checkout: a container's build context), so that two builds of
# one commit make the same package. Prints its path.
make_deb() {
    local root="$1" version="$2" out="$3" tree="$4"
    local arch pkg stage lib doc deb when depends
    arch="$(dpkg --print-architecture)"
    pkg="$(deb_name)"
    stage="$(mktemp -d)"
    cp -a "$root/." "$stage/"
    chmod -R u+rwX,go+rX,go-w "$stage"
    lib="$stage$("$PG_CONFIG" --pkglibdir)/snowflake.so"
    # Debian ships stripped objects (the symbols would make the package several times larger).
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$lib"
    chmod 644 "$lib"
    doc="$stage/usr/share/doc/$pkg"
    gzip -9n "$doc/changelog"
    when="$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$tree" log -1 --format=%ct)}")"
    printf '%s (%s-1) unstable; urgency=medium\n\n  * Upstream release %s: see changelog.gz.\n\n -- %s  %s\n' \
        "$pkg" "$version" "$version" "$DEB_MAINTAINER" "$when" | gzip -9n >"$doc/changelog.Debian.gz"
    depends="$(shlib_depends "$lib")"
    mkdir "$stage/DEBIAN"
    (cd "$stage" && find . -type f ! -path './DEBIAN/*' -printf '%P\n' | LC_ALL=C sort |
        xargs md5sum) >"$stage/DEBIAN/md5sums"
    cat >"$stage/DEBIAN/control" <<CONTROL
Package: $pkg
Version: $version-1
Architecture: $arch
Maintainer: $DEB_MAINTAINER
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: postgresql-$PG_MAJOR, $depends
Section: database
Priority: optional
Homepage: https://pgxn.org/dist/snowflake/
Description: Snowflake IDs generated inside PostgreSQL $PG_MAJOR
 snowflake generates Twitter-style 64-bit IDs inside the server: time-ordered,
 unique across servers (41 bits of milliseconds, 5 of datacenter, 5 of worker,
 12 of sequence), from shared memory, with a durable lease in the data directory
 and in WAL. SQL functions decode any ID back into its parts. Worker ids come
 from postgresql.conf or are claimed from a registry (Redis, Redis Sentinel,
 etcd or a PostgreSQL coordinator).
 .
 The library must be listed in shared_preload_libraries. This package is built
 for PostgreSQL $PG_MAJOR.
CONTROL
    mkdir -p "$out"
    deb="$out/${pkg}_${version}-1_${arch}.deb"
    # SOURCE_DATE_EPOCH: dpkg-deb clamps the files' times to the commit's.
    SOURCE_DATE_EPOCH="$(date -d "$when" +%s)" dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
    rm -rf "$stage"
    echo "$deb"
}

# this_release_deb: where package_extension writes this checkout's .deb for this major.
this_release_deb() {
    local version
    version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -1)"
    echo "$REPO_ROOT/target/package/$(deb_name)_${version}-1_$(dpkg --print-architecture).deb"
}

# package_extension: this checkout's packages for this major in target/package: the .deb
# and a tarball of the same files (to unpack over / where there is no dpkg). Prints the .deb.
package_extension() {
    local version root deb
    version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -1)"
    root="$(build_package_tree "$REPO_ROOT" "$REPO_ROOT/target")"
    deb="$(make_deb "$root" "$version" "$REPO_ROOT/target/package" "$REPO_ROOT")"
    [ "$deb" = "$(this_release_deb)" ]
    dpkg-deb --fsys-tarfile "$deb" | gzip -9n \
        >"$REPO_ROOT/target/package/snowflake-${version}-pg${PG_MAJOR}-$(dpkg --print-architecture).tar.gz"
    echo "$deb"
}

# packaging_digest: a short hash of this checkout's packaging (these scripts, lib.sh's
# shlib_depends among them, the copyright template, overrides and license texts), so that a
# packaging change rebuilds the cached release.
packaging_digest() {
    (cd "$REPO_ROOT" && cat scripts/packaging.sh scripts/lib.sh scripts/debian-copyright.py \
        packaging/debian/copyright packaging/debian/crate-overrides packaging/debian/licenses/*) |
        sha256sum | cut -c1-12
}

# previous_release_deb: the package of the previous release (packaging/previous-release
# names its version and commit), built from that commit with this checkout's packaging, and
# kept in RELEASE_CACHE. Prints its path.
previous_release_deb() {
    local version commit cache deb worktree root
    read -r version commit <"$REPO_ROOT/packaging/previous-release"
    cache="$RELEASE_CACHE/$commit-pg$PG_MAJOR-$(packaging_digest)"
    deb="$cache/$(deb_name)_${version}-1_$(dpkg --print-architecture).deb"
    if [ ! -f "$deb" ]; then
        # The same release wrapped by an earlier packaging: no longer of use.
        find "$RELEASE_CACHE" -mindepth 1 -maxdepth 1 \
            \( -name "$commit-pg$PG_MAJOR" -o -name "$commit-pg$PG_MAJOR-*" \) \
            ! -path "$cache" -exec rm -rf {} + 2>/dev/null || true
        git -C "$REPO_ROOT" cat-file -e "$commit^{commit}" 2>/dev/null || {
            echo "previous_release_deb: commit $commit (release $version) is not in this clone: the upgrade test needs the history (git fetch --unshallow)" >&2
            return 1
        }
        worktree="${SNOWFLAKE_RUN_DIR:-/var/tmp}/release-$commit-pg$PG_MAJOR"
        git -C "$REPO_ROOT" worktree remove --force "$worktree" 2>/dev/null || rm -rf "$worktree"
        git -C "$REPO_ROOT" worktree add --detach "$worktree" "$commit" >/dev/null
        root="$(build_package_tree "$worktree" /var/tmp/snowflake-ab-target)"
        make_deb "$root" "$version" "$cache" "$worktree" >/dev/null
        git -C "$REPO_ROOT" worktree remove --force "$worktree"
    fi
    echo "$deb"
}
