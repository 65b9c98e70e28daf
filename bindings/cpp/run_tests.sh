#!/usr/bin/env bash
# Builds and tests stoker's C++ API: the GoogleTest suite (CTest), the LibTorch adapter, the
# README example, an install + find_package consumer, and the example trainer.
#
#   bindings/cpp/run_tests.sh            (from anywhere; idempotent)
#
# Environment:
#   STOKER_CACHE        downloads (LibTorch) live here; default ~/.cache/stoker
#   STOKER_SKIP_TORCH=1 skip LibTorch (adapter test and trainer)
#   CARGO_TARGET_DIR    cargo's target dir; default <repo>/target
#   BUILD_DIR           CMake build dir; default <repo>/build-cpp
#   JOBS                parallel build jobs; default 2
#   STOKER_CARGO_PROFILE the cargo profile of the Release configuration's Rust libraries; default
#                       release (.ci/test.sh passes dev, the build `cargo test` just made)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-2}"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-cpp}"
PREFIX="$BUILD_DIR/install"
CACHE="${STOKER_CACHE:-$HOME/.cache/stoker}"
TORCH_VERSION=2.15.0
TORCH_HOME="$CACHE/libtorch-$TORCH_VERSION"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

step() { printf '\n==> %s\n' "$*"; }
START=$SECONDS

# ---- tools: cmake, a C++ compiler, GoogleTest (Debian packages; nothing fetched by CMake) ----
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
[ -f /usr/include/gtest/gtest.h ] || missing+=(libgtest-dev)
command -v unzip >/dev/null || missing+=(unzip)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi

# ---- LibTorch from the PyPI wheel, without its CUDA dependencies ----
TORCH_ARGS=()
if [ "${STOKER_SKIP_TORCH:-0}" != 1 ]; then
  if [ ! -f "$TORCH_HOME/torch/lib/libtorch_cpu.so" ]; then
    step "fetching LibTorch $TORCH_VERSION (torch wheel, --no-deps) into $TORCH_HOME"
    mkdir -p "$CACHE/wheels"
    wheel="$(ls "$CACHE"/wheels/torch-"$TORCH_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
      python3 -m pip download --quiet --no-deps "torch==$TORCH_VERSION" -d "$CACHE/wheels"
      wheel="$(ls "$CACHE"/wheels/torch-"$TORCH_VERSION"-*.whl | head -n1)"
    fi
    rm -rf "$TORCH_HOME.partial"
    mkdir -p "$TORCH_HOME.partial"
    unzip -q "$wheel" 'torch/include/*' 'torch/lib/*' -d "$TORCH_HOME.partial"
    rm -rf "$TORCH_HOME"
    mv "$TORCH_HOME.partial" "$TORCH_HOME"
  fi
  TORCH_ARGS+=("-DSTOKER_TORCH_DIR=$TORCH_HOME/torch")
  # The wheel's libtorch_cpu.so names libcudart.so.13 and libcupti.so.13 (shipped by the nvidia-*
  # wheels we do not install). When they cannot be found, the build makes no-op stand-ins.
  # ldd's output is captured first: under pipefail, `ldd | grep -q` fails when grep exits early.
  ldd_out="$(ldd "$TORCH_HOME/torch/lib/libtorch_cpu.so" || true)"
  if grep -Eq 'libcu(dart|pti)[^ ]* => not found' <<<"$ldd_out"; then
    echo "libtorch_cpu.so needs CUDA runtime libraries that are absent: building no-op stand-ins for the tests"
    TORCH_ARGS+=(-DSTOKER_TORCH_CUDA_STUBS=ON)
  else
    TORCH_ARGS+=(-DSTOKER_TORCH_CUDA_STUBS=OFF)
  fi
else
  TORCH_ARGS+=(-DSTOKER_TORCH_DIR=)
fi

# ---- the README's example is examples/readme.cpp (less its first comment line) ----
step "README example is examples/readme.cpp"
diff <(awk '/^```cpp$/{on=1; next} /^```$/{if (on) exit} on' bindings/cpp/README.md) \
     <(tail -n +2 bindings/cpp/examples/readme.cpp)
echo "in sync"

# ---- configure, build, test ----
step "configure ($BUILD_DIR)"
PROFILE="${STOKER_CARGO_PROFILE:-release}"
cmake -S bindings/cpp -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
  "-DSTOKER_CARGO_TARGET_DIR=$CARGO_TARGET_DIR" "-DSTOKER_CARGO_JOBS=$JOBS" \
  "-DSTOKER_CARGO_PROFILE_RELEASE=$PROFILE" "${TORCH_ARGS[@]}" >/dev/null
t=$SECONDS
step "build (cargo $PROFILE profile + C++, -j $JOBS)"
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "build: $((SECONDS - t)) s"

t=$SECONDS
step "ctest"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$JOBS")
echo "ctest: $((SECONDS - t)) s"

# ---- install, then a find_package(stoker) consumer against the prefix ----
t=$SECONDS
step "install to $PREFIX and build the consumer"
rm -rf "$PREFIX"
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >/dev/null
cmake -S bindings/cpp/tests/consumer -B "$BUILD_DIR/consumer" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_PREFIX_PATH=$PREFIX" >/dev/null
cmake --build "$BUILD_DIR/consumer" -j "$JOBS"
(cd "$BUILD_DIR/consumer" && ./consumer)
echo "consumer: $((SECONDS - t)) s"

# ---- the example trainer ----
if [ "${STOKER_SKIP_TORCH:-0}" != 1 ]; then
  step "example trainer (stoker_train --steps 40)"
  (cd "$BUILD_DIR" && ./stoker_train --steps 40)
fi

step "all C++ checks passed in $((SECONDS - START)) s"
