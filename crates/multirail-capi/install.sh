#!/usr/bin/env bash
# Builds multirail's C library and installs it where C programs find it
# with pkg-config:
#
#   crates/multirail-capi/install.sh PREFIX      # e.g. /usr/local or ~/.local
#
# installs PREFIX/lib/libmultirail_c.so and libmultirail_c.a,
# PREFIX/include/multirail.h and PREFIX/lib/pkgconfig/multirail.pc. Then:
#
#   export PKG_CONFIG_PATH=PREFIX/lib/pkgconfig   # unless PREFIX is /usr/local or /usr
#   cc prog.c $(pkg-config --cflags --libs multirail) -o prog
#
# (docs/c.md: running it, static linking, rpath).
set -euo pipefail
if [ $# -ne 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
    sed -n '2,13p' "$0"
    [ $# -eq 1 ] && exit 0
    exit 2
fi
prefix=$(realpath -m "$1")
cd "$(dirname "$0")/../.."
cargo build --release -q -p multirail-capi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
install -d "$prefix/lib/pkgconfig" "$prefix/include"
install -m 0644 target/release/libmultirail_c.a "$prefix/lib/"
install -m 0755 target/release/libmultirail_c.so "$prefix/lib/"
install -m 0644 crates/multirail-capi/include/multirail.h "$prefix/include/"
cat >"$prefix/lib/pkgconfig/multirail.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: multirail
Description: several network links as one ordered, reliable message channel (C API)
Version: $version
Libs: -L\${libdir} -lmultirail_c
Libs.private: -lpthread -ldl -lm
Cflags: -I\${includedir}
PC
echo "installed multirail $version (C API) in $prefix: lib/libmultirail_c.{so,a}, include/multirail.h, lib/pkgconfig/multirail.pc"
