#!/usr/bin/env bash
# libjpeg-turbo's TurboJPEG library, built once from the sources the turbojpeg-sys crate vendors
# (the same version, flags and SIMD code as its own build), for the test command's host builds.
# Left to itself, turbojpeg-sys builds the library with CMake in every build that links it: the
# dev build the lints, tests, C, C++ and remote steps share, and the fuzz targets' build, each
# time with every program of the libjpeg-turbo tree (cjpeg, djpeg, tjbench, ...). Here only the
# static library is built, once, into the cache; it stays there for later runs.
#
# Prints the environment that points turbojpeg-sys at it (TURBOJPEG_SOURCE=explicit, its lib and
# include directories), for `eval`. The wheel's build does not use it: cross-built against glibc
# 2.17 by zig, it builds its own.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${STOKER_CACHE:-$HOME/.cache/stoker}
read -r version manifest < <(cargo metadata --format-version 1 --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "turbojpeg-sys":
        print(p["version"], p["manifest_path"])
        break
')
sources="$(dirname "$manifest")/libjpeg-turbo"
prefix="$cache/turbojpeg-sys-$version"
if [ ! -f "$prefix/lib/libturbojpeg.a" ] || [ ! -f "$prefix/include/jconfig.h" ]; then
  echo "==> libjpeg-turbo of turbojpeg-sys $version into $prefix (once)" >&2
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  # What the crate's build asks of CMake (a static library, optimised as cargo's dependencies
  # are, position-independent for libstoker.so), for one target.
  cmake -S "$sources" -B "$build" -DENABLE_SHARED=0 -DENABLE_STATIC=1 \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_POSITION_INDEPENDENT_CODE=ON >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log" >&2; exit 1; }
  cmake --build "$build" --target turbojpeg-static -j "$(nproc)" >"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log" >&2; exit 1; }
  # jconfig.h, CMake's record of the build, says whether it has SIMD (stoker-core's build.rs
  # reads WITH_SIMD there, as it does in the crate's own install); it is checked here too, so
  # that a machine without nasm fails loudly instead of testing the zune-jpeg fallback.
  grep -qx '#define WITH_SIMD 1' "$build/jconfig.h" ||
    { echo "libjpeg-turbo configured without SIMD: is nasm installed (.ci/native-deps.sh)?" >&2; exit 1; }
  rm -rf "$prefix"
  mkdir -p "$prefix/lib" "$prefix/include"
  cp "$sources/src/turbojpeg.h" "$build/jconfig.h" "$prefix/include/"
  cp "$build/libturbojpeg.a" "$prefix/lib/"
fi
echo "export TURBOJPEG_SOURCE=explicit TURBOJPEG_LIB_DIR='$prefix/lib' TURBOJPEG_INCLUDE_DIR='$prefix/include'"
