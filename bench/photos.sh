#!/usr/bin/env bash
# Prints the folder of the camera photographs of Debian's `mate-backgrounds` package: the
# installed package's, else the package fetched once with `apt-get download` and unpacked into
# bench/.data/photos (where later runs find it). The benchmarks cut their ImageNet-like folders
# from these.
set -euo pipefail
cd "$(dirname "$0")/.."

nature=usr/share/backgrounds/mate/nature
if [ -d "/$nature" ]; then
  echo "/$nature"
  exit 0
fi
photos=bench/.data/photos
if [ ! -d "$photos/$nature" ]; then
  mkdir -p "$photos"
  (
    cd "$photos"
    apt-get download mate-backgrounds >&2 2>/dev/null ||
      { apt-get update -qq >&2 && apt-get download mate-backgrounds >&2; }
    dpkg -x mate-backgrounds_*.deb .
  )
fi
echo "$PWD/$photos/$nature"
