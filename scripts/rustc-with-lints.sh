#!/bin/sh
# Cargo's build.rustc-workspace-wrapper (.cargo/config.toml): the workspace's own crates are
# compiled by clippy-driver, which generates the same code as rustc and also runs clippy's
# lints, so that `cargo build` (and cargo pgrx) refuses what Cargo.toml's lints deny, such
# as an `unsafe` block without its `// SAFETY:` comment. Dependencies are compiled by rustc
# as usual. Where clippy is not installed (rustup's minimal profile), plain rustc.
rustc="$1"
shift
if command -v clippy-driver >/dev/null 2>&1; then
    exec clippy-driver "$rustc" "$@"
fi
exec "$rustc" "$@"
