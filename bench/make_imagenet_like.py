#!/usr/bin/env python3
"""Builds an ImageNet-like folder of real photographs for the benchmark.

    python bench/make_imagenet_like.py OUT_DIR PHOTO [PHOTO ...]

The photos are the camera shots of Debian's `mate-backgrounds` package (bench/run.sh fetches
them). Each class directory gets crops of one or two photos at random positions, scales and
orientations, resized to ImageNet's typical 500x375 (or 375x500) and re-encoded as baseline
JPEG, quality 90, named *.JPEG like ImageNet's files. Deterministic (fixed seed); a complete
folder is left as it is, so reruns are free.
"""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = 10
PER_CLASS = 128  # 1280 images: 20 batches of 64 per epoch


def random_crop(photo: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A crop covering 10-60% of `photo`, landscape 4:3 or (one in five) portrait 3:4."""
    w, h = photo.size
    out = (375, 500) if rng.random() < 0.2 else (500, 375)
    aspect = out[0] / out[1]
    area = rng.uniform(0.1, 0.6) * w * h
    cw = min(w, int(round((area * aspect) ** 0.5)))
    ch = min(h, int(round(cw / aspect)))
    left = int(rng.integers(0, w - cw + 1))
    top = int(rng.integers(0, h - ch + 1))
    return photo.crop((left, top, left + cw, top + ch)).resize(out, Image.LANCZOS)


def main(out_dir: str, photos: list[str]) -> None:
    out = Path(out_dir)
    done = out / ".complete"
    if done.exists():
        print(f"{out}: already built")
        return
    if len(photos) < CLASSES:
        raise SystemExit(f"need at least {CLASSES} photos, got {len(photos)}")
    rng = np.random.default_rng(0)
    photos = sorted(photos)
    for c in range(CLASSES):
        # Class c gets photos c, c + CLASSES, ...: every photo is used, classes stay distinct.
        sources = [Image.open(p).convert("RGB") for p in photos[c::CLASSES]]
        name = f"n{c:08d}"
        (out / name).mkdir(parents=True, exist_ok=True)
        for k in range(PER_CLASS):
            img = random_crop(sources[k % len(sources)], rng)
            img.save(out / name / f"{name}_{k:04d}.JPEG", quality=90)
    done.touch()
    print(f"{out}: {CLASSES * PER_CLASS} images in {CLASSES} classes")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
