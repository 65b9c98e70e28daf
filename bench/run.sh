#!/usr/bin/env bash
# The side-by-side benchmark in one command: stoker vs torch DataLoader, torchvision
# decode_jpeg + transforms.v2, NVIDIA DALI (CPU) and webdataset, on the same data in one run.
# `bash bench/run.sh --workloads tar` runs a subset (images, npy, tar).
# Idempotent: the venv (bench/.venv, several GB: torch, DALI), the photos and the data under
# bench/.data are made once and reused. Takes about 2 minutes on 2 cores once installed.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/native-deps.sh  # CMake and nasm, for the vendored libjpeg-turbo
venv=bench/.venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch torchvision nvidia-dali-cuda130 pillow numpy psutil webdataset
# Builds libstoker with cargo (or bundles $STOKER_LIBRARY) into the package.
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./bindings/python
# The CLI, for the decode-only limit (`stoker bench decoders`).
cargo build --release -q -p stoker-cli

images=bench/.data/imagenet_like
if [ ! -e "$images/.complete" ]; then
  # Real camera photos: Debian's mate-backgrounds package.
  photos=bench/.data/photos
  mkdir -p "$photos"
  if [ ! -d "$photos/usr" ]; then
    (
      cd "$photos"
      apt-get download mate-backgrounds 2>/dev/null || { apt-get update -qq && apt-get download mate-backgrounds; }
      dpkg -x mate-backgrounds_*.deb .
    )
  fi
  "$venv/bin/python" bench/make_imagenet_like.py "$images" "$photos"/usr/share/backgrounds/mate/nature/*.jpg
fi

"$venv/bin/python" bench/compare.py "$@"
