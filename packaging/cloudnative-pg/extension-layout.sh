#!/usr/bin/env bash
# Lays the files of the extension's Debian package out as a CloudNativePG image volume
# extension expects them, under OUT:
#   OUT/lib/snowflake.so                  (CloudNativePG appends OUT/lib to dynamic_library_path)
#   OUT/share/extension/snowflake.control (and the SQL scripts; OUT/share to extension_control_path)
#   OUT/share/doc/snowflake/copyright
# The control file's module_pathname is the bare 'snowflake' (no $libdir/), so that the
# server finds the library through dynamic_library_path wherever the volume is mounted.
#   packaging/cloudnative-pg/extension-layout.sh DEB OUT
set -euo pipefail
deb="$1"
out="$2"
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
dpkg-deb -x "$deb" "$unpacked"
libs=("$unpacked"/usr/lib/postgresql/*/lib/snowflake.so)
controls=("$unpacked"/usr/share/postgresql/*/extension/snowflake.control)
[ -f "${libs[0]}" ] && [ -f "${controls[0]}" ] || {
    echo "extension-layout.sh: $deb holds no snowflake.so or snowflake.control at PGDG's paths" >&2
    exit 1
}
grep -qx "module_pathname = 'snowflake'" "${controls[0]}" || {
    echo "extension-layout.sh: the control file names the library with a directory; CloudNativePG needs module_pathname = 'snowflake'" >&2
    exit 1
}
rm -rf "$out"
install -d "$out/lib" "$out/share/extension" "$out/share/doc/snowflake"
install -m 644 "${libs[0]}" "$out/lib/"
install -m 644 "$(dirname "${controls[0]}")"/snowflake* "$out/share/extension/"
install -m 644 "$unpacked"/usr/share/doc/postgresql-*-snowflake/copyright "$out/share/doc/snowflake/"
