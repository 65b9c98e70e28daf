#!/usr/bin/env bash
# The native tools stoker's own build needs beyond a Rust toolchain, installed once: CMake builds
# the vendored libjpeg-turbo, and nasm gives it its SIMD code (without nasm it still builds, but
# then stoker decodes JPEGs with zune-jpeg, which is faster than libjpeg-turbo without SIMD).
# Sourced or run by the README's commands before their first cargo build.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v nasm >/dev/null || need+=(nasm)
if ((${#need[@]})); then
  echo "installing ${need[*]} (Debian packages) for the libjpeg-turbo build"
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo apt-get install -y -qq "${need[@]}" || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}"; }
fi
