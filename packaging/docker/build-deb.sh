#!/usr/bin/env bash
# The container's build step: the extension's Debian package for PostgreSQL MAJOR, built
# from this source tree against that major's pg_config (PGDG's layout:
# /usr/lib/postgresql/MAJOR/bin/pg_config, from postgresql-server-dev-MAJOR), copied to OUT.
# Needs cargo-pgrx 0.18.1, clang, dpkg-dev, python3; no `cargo pgrx init`.
#   packaging/docker/build-deb.sh MAJOR OUT
set -euo pipefail
major="$1"
out="$2"
tree="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$tree/scripts/lib.sh"
use_major "$major"
source "$tree/scripts/packaging.sh"
mkdir -p "$out"
deb="$(package_extension)"
cp "$deb" "$out/"
echo "$out/$(basename "$deb")"
