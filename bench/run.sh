#!/usr/bin/env bash
# The side-by-side benchmark in one command: stoker vs torch DataLoader, torchvision
# decode_jpeg + transforms.v2, NVIDIA DALI (CPU) and webdataset, on the same data in one run.
# `bash bench/run.sh --workloads tar` runs a subset (images, npy, tar; `parquet`, Hugging Face
# image Parquet files against `datasets`, runs only when named); `bash bench/run.sh
# --packed` installs FFCV 1.0.2 and compares stoker's packed format with it instead
# (bench/compare_packed.py).
# Idempotent: the venv (bench/.venv, several GB: torch, DALI), the photos and the data under
# bench/.data are made once and reused. Takes about 2 minutes on 2 cores once installed.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/native-deps.sh  # CMake and nasm, for the vendored libjpeg-turbo
venv=bench/.venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q torch torchvision nvidia-dali-cuda130 pillow numpy psutil webdataset \
  pyarrow datasets
# Builds libstoker with cargo (or bundles $STOKER_LIBRARY) into the package.
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps ./bindings/python
# The CLI, for the decode-only limit (`stoker bench decoders`) and `stoker pack`.
cargo build --release -q -p stoker-cli

if [[ " $* " == *" --packed "* ]] && ! "$venv/bin/python" -c "import ffcv" 2>/dev/null; then
  # FFCV 1.0.2 for the packed-format comparison (bench/compare_packed.py). It builds its C
  # extension from source against Debian's libturbojpeg and OpenCV, found with pkg-config; the
  # constraints keep the venv's numpy, torch, torchvision and Pillow as they are.
  need=(libturbojpeg0-dev libopencv-dev pkg-config)
  if ! dpkg -s "${need[@]}" >/dev/null 2>&1; then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get install -y -qq "${need[@]}" || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "${need[@]}"; }
  fi
  constraints=$(mktemp)
  "$venv/bin/python" -m pip freeze | grep -iE '^(numpy|torch|torchvision|pillow)==' >"$constraints"
  "$venv/bin/python" -m pip install -q -c "$constraints" ffcv==1.0.2
  rm -f "$constraints"
fi

images=bench/.data/imagenet_like
if [ ! -e "$images/.complete" ]; then
  # Real camera photos: Debian's mate-backgrounds package.
  photos=$(bash bench/photos.sh)
  "$venv/bin/python" bench/make_imagenet_like.py "$images" "$photos"/*.jpg
fi

"$venv/bin/python" bench/compare.py "$@"
