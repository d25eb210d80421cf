#!/bin/sh
# Cargo's build.rustc-workspace-wrapper (.cargo/config.toml), called as
# `rustc-with-lints.sh RUSTC ARGS...` for the workspace's own crates (dependencies are
# compiled by rustc as usual). A development build (no optimization) of the extension is
# compiled by clippy-driver, which runs clippy's lints as it compiles, so that a plain
# `cargo build` refuses what Cargo.toml's lints deny, such as an `unsafe` block without its
# `// SAFETY:` comment. Everything else is compiled by RUSTC itself:
# - optimized builds (releases, packages, benchmarks): clippy-driver turns MIR optimizations
#   off, and a shipped library is rustc's;
# - the #[pg_test] builds (feature pg_test): clippy-driver turns off rustc's debug checks of
#   pointer alignment and null, which the tests of unsafe code want;
# - where clippy-driver is missing or broken (rustup's minimal profile installs a proxy that
#   fails) or belongs to another toolchain than RUSTC, or RUSTC is not named rustc.
rustc="$1"
shift
use_clippy=yes
previous=""
for arg in "$@"; do
    case "$previous=$arg" in
        -C=opt-level=0) ;;
        -C=opt-level=*) use_clippy=no ;;
        --cfg=feature=\"pg_test\") use_clippy=no ;;
    esac
    case "$arg" in
        -Copt-level=0) ;;
        -Copt-level=*) use_clippy=no ;;
        -vV | -V | --version | --print | --print=*) use_clippy=no ;;
    esac
    previous="$arg"
done
if [ "$use_clippy" = yes ] && [ "$(basename "$rustc")" = rustc ] &&
    rustc_version="$("$rustc" -vV 2>/dev/null)" &&
    [ "$(clippy-driver "$rustc" -vV 2>/dev/null)" = "$rustc_version" ]; then
    exec clippy-driver "$rustc" "$@"
fi
exec "$rustc" "$@"
