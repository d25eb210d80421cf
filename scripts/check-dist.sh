#!/usr/bin/env bash
# The PGXN distribution: META.json validated against PGXN's Meta Spec (pgxn_meta, the
# validator PGXN publishes), its versions matching Cargo.toml's, and the source
# distribution (target/package/snowflake-<version>.zip, what is uploaded to PGXN) unpacked
# elsewhere, built with `make` and installed with `make install DESTDIR=...` as `pgxn install`
# does, for one major (PG_MAJOR). The files installed must be those of the .deb (without its
# docs), when target/package has one.
#   scripts/check-dist.sh [--zip-only]
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$REPO_ROOT/scripts/packaging.sh"
use_run_dir
cd "$REPO_ROOT"
fail() { echo "check-dist.sh: $*" >&2; exit 1; }

# PGXN's own validator. Installed here rather than by setup.sh: the test command runs this
# script beside the integration tests, where its 2.5 minutes of compiling cost no wall time.
if [ "$(pgxn_meta --version 2>/dev/null || true)" != "pgxn_meta 0.7.0" ]; then
    log "Installing pgxn_meta 0.7.0 (about 2.5 minutes)"
    cargo install pgxn_meta --version 0.7.0 --locked
fi
log "META.json against PGXN's Meta Spec"
pgxn_meta META.json >&2
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
meta_versions="$(/usr/bin/python3 -c '
import json
m = json.load(open("META.json"))
print(" ".join(sorted({m["version"]} | {e["version"] for e in m["provides"].values()})))')"
[ "$meta_versions" = "$version" ] || fail "META.json says $meta_versions, Cargo.toml $version"
for f in $(/usr/bin/python3 -c '
import json
m = json.load(open("META.json"))
print(" ".join(p for e in m["provides"].values() for p in (e["file"], e.get("docfile")) if p))'); do
    [ -f "$f" ] || fail "META.json names $f, which does not exist"
done

# The distribution holds what git tracks (a commit of the working tree's changes when there
# are any, so that a check before committing sees them).
mkdir -p target/package
zip="target/package/snowflake-$version.zip"
rev="$(git stash create)"
git archive --format=zip --prefix="snowflake-$version/" -o "$zip" "${rev:-HEAD}"
log "Source distribution: $zip ($(du -k "$zip" | cut -f1) kB)"
[ "${1:-}" = --zip-only ] && exit 0

dist="$SNOWFLAKE_RUN_DIR/dist-pg$PG_MAJOR"
rm -rf "$dist"
mkdir -p "$dist/stage"
(cd "$dist" && unzip -q "$REPO_ROOT/$zip")
log "make && make install DESTDIR=... in the unpacked distribution (PostgreSQL $PG_MAJOR)"
# The registry crates are compiled already in this checkout's target directory; only the
# distribution's own crates build again (their path differs).
make -C "$dist/snowflake-$version" PG_CONFIG="$PG_CONFIG" CARGO_TARGET_DIR="$REPO_ROOT/target" \
    >"$dist/make.log" 2>&1 || { tail -40 "$dist/make.log" >&2; fail "make failed"; }
make -C "$dist/snowflake-$version" install PG_CONFIG="$PG_CONFIG" CARGO_TARGET_DIR="$REPO_ROOT/target" \
    DESTDIR="$dist/stage" >>"$dist/make.log" 2>&1 || { tail -20 "$dist/make.log" >&2; fail "make install failed"; }
installed="$(cd "$dist/stage" && find . -type f | sed 's|^\.||' | LC_ALL=C sort)"
for f in "$("$PG_CONFIG" --pkglibdir)/snowflake.so" \
         "$("$PG_CONFIG" --sharedir)/extension/snowflake.control" \
         "$("$PG_CONFIG" --sharedir)/extension/snowflake--$version.sql"; do
    grep -qx "$f" <<<"$installed" || fail "make install did not install $f"
done
# The secondary control files that keep earlier versions for superusers (docs/upgrades.md).
for f in sql/snowflake--*.control; do
    grep -qx "$("$PG_CONFIG" --sharedir)/extension/$(basename "$f")" <<<"$installed" ||
        fail "make install did not install $(basename "$f")"
done
deb="target/package/$(deb_name)_${version}-1_$(dpkg --print-architecture).deb"
if [ -f "$deb" ]; then
    packaged="$(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\.||' | grep -v '/$' |
        grep -v '^/usr/share/doc/' | LC_ALL=C sort)"
    [ "$installed" = "$packaged" ] || {
        diff <(echo "$packaged") <(echo "$installed") >&2
        fail "make install and the .deb install different files"
    }
fi
rm -rf "$dist"
log "PGXN distribution $zip: valid, builds and installs the same files as the .deb"
