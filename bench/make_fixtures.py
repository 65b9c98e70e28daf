#!/usr/bin/env python3
"""Builds the image fixtures of stoker-core's tests from real camera photos.

Source photos: Debian's `mate-backgrounds` package (real photographs, GPL-2+):

    apt-get update && apt-get download mate-backgrounds && dpkg -x mate-backgrounds_*.deb /tmp/bg
    pip install pillow numpy
    python3 bench/make_fixtures.py /tmp/bg/usr/share/backgrounds/mate/nature

Writes into crates/stoker-core/tests/data/images/:

* photo_*.{jpg,png,JPEG}: ImageNet-like (about 500x375) re-encodings: baseline, progressive,
  grayscale and CMYK JPEG, an RGB PNG, and a PNG whose name says `.JPEG`.
* <fixture>.ref.rgb: Pillow's decode (`Image.open(f).convert('RGB')`, libjpeg-turbo) of the
  central 160x120 region, raw RGB8, row-major. The Rust test decodes the whole file with stoker
  and compares that region (mean absolute difference per channel <= 1 level).
* png_{gray,gray_alpha,palette,rgba,rgb16,gray16}.png (64x48) and their full Pillow decodes,
  for the PNG colour types.
* tiny_1x1.{jpg,png}; bomb_10000x10000.{jpg,png}: a 1x1 image whose header was edited to claim
  10000x10000 (the decoder must refuse it before allocating).
* resize_*.rgb: reference resamples computed by Pillow from the lossless PNG fixture, the same
  operations torchvision runs on PIL images (crop, then resize with BILINEAR, antialiased):
  - resize_crop_box.rgb: img.crop((37, 21, 37+301, 21+250)).resize((112, 96), BILINEAR)
    (torchvision's resized_crop(img, top=21, left=37, height=250, width=301, size=[96, 112]))
  - resize_center.rgb: img.resize((W', 128), BILINEAR) with W' = int(128 * W / H), then
    the 112x112 centre crop (torchvision Resize(128) + CenterCrop(112))
* manifest.json: sizes and per-channel means of every reference.
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "crates", "stoker-core", "tests", "data", "images")
REF_W, REF_H = 160, 120


def photo(src_dir, name, size=(500, 375)):
    """A centre crop of a photo at the aspect of `size`, downscaled to `size`."""
    im = Image.open(os.path.join(src_dir, name)).convert("RGB")
    w, h = im.size
    tw, th = size
    scale = min(w / tw, h / th)
    cw, ch = int(tw * scale), int(th * scale)
    left, top = (w - cw) // 2, (h - ch) // 2
    return im.crop((left, top, left + cw, top + ch)).resize(size, Image.LANCZOS)


def centre_region(rgb):
    h, w, _ = rgb.shape
    top, left = (h - REF_H) // 2, (w - REF_W) // 2
    return rgb[top : top + REF_H, left : left + REF_W]


def pillow_rgb(path):
    return np.asarray(Image.open(path).convert("RGB"))


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def main():
    src_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/bg/usr/share/backgrounds/mate/nature"
    os.makedirs(OUT, exist_ok=True)
    manifest = {}

    def save_ref(fname, arr, extra=None):
        arr = np.ascontiguousarray(arr, dtype=np.uint8)
        with open(os.path.join(OUT, fname), "wb") as f:
            f.write(arr.tobytes())
        entry = {
            "width": arr.shape[1],
            "height": arr.shape[0],
            "mean": [round(float(arr[..., c].mean()), 4) for c in range(3)],
        }
        entry.update(extra or {})
        manifest[fname] = entry

    # Real-photo fixtures, ImageNet-like size.
    photos = [
        ("photo_baseline.jpg", "Garden.jpg", dict(format="JPEG", quality=90)),
        ("photo_progressive.jpg", "Dune.jpg", dict(format="JPEG", quality=88, progressive=True)),
        ("photo_gray.jpg", "LadyBird.jpg", dict(format="JPEG", quality=90)),
        ("photo_cmyk.jpg", "YellowFlower.jpg", dict(format="JPEG", quality=90)),
        ("photo_444.jpg", "Storm.jpg", dict(format="JPEG", quality=92, subsampling=0)),
        ("photo_png.png", "Aqua.jpg", dict(format="PNG", optimize=True)),
        ("photo_png_named.JPEG", "TwoWings.jpg", dict(format="PNG", optimize=True)),
    ]
    for fname, src, kw in photos:
        size = (250, 188) if kw["format"] == "PNG" else (500, 375)
        im = photo(src_dir, src, size)
        if "gray" in fname:
            im = im.convert("L")
        if "cmyk" in fname:
            im = im.convert("CMYK")
        path = os.path.join(OUT, fname)
        im.save(path, **kw)
        full = pillow_rgb(path)
        save_ref(
            fname + ".ref.rgb",
            centre_region(full),
            {
                "image_width": full.shape[1],
                "image_height": full.shape[0],
                "image_mean": [round(float(full[..., c].mean()), 4) for c in range(3)],
            },
        )

    # PNG colour types, small.
    base = photo(src_dir, "RainDrops.jpg", (64, 48))
    alpha = Image.linear_gradient("L").resize((64, 48))
    variants = {
        "png_gray.png": base.convert("L"),
        "png_gray_alpha.png": Image.merge("LA", (base.convert("L"), alpha)),
        "png_palette.png": base.convert("P", palette=Image.ADAPTIVE, colors=64),
        "png_rgba.png": Image.merge("RGBA", (*base.split(), alpha)),
    }
    for fname, im in variants.items():
        path = os.path.join(OUT, fname)
        im.save(path)
        save_ref(fname + ".ref.rgb", pillow_rgb(path))
    # 16-bit RGB and gray: Pillow cannot write 16-bit RGB PNGs, so write them by hand; the
    # reference is the high byte of each sample (what stoker documents).
    rgb8 = np.asarray(base)
    rgb16 = rgb8.astype(np.uint16) * 257 + np.arange(64, dtype=np.uint16)[None, :, None] % 7
    gray16 = rgb16[..., 1]
    for fname, arr, ctype in [("png_rgb16.png", rgb16, 2), ("png_gray16.png", gray16, 0)]:
        h, w = arr.shape[:2]
        raw = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))
        data = (
            b"\x89PNG\r\n\x1a\n"
            + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw, 9))
            + png_chunk(b"IEND", b"")
        )
        with open(os.path.join(OUT, fname), "wb") as f:
            f.write(data)
        hi = (arr >> 8).astype(np.uint8)
        if hi.ndim == 2:
            hi = np.stack([hi] * 3, axis=-1)
        save_ref(fname + ".ref.rgb", hi)

    # 1x1 images.
    Image.new("RGB", (1, 1), (200, 100, 50)).save(os.path.join(OUT, "tiny_1x1.jpg"), quality=95)
    Image.new("RGB", (1, 1), (200, 100, 50)).save(os.path.join(OUT, "tiny_1x1.png"))
    for fname in ["tiny_1x1.jpg", "tiny_1x1.png"]:
        save_ref(fname + ".ref.rgb", pillow_rgb(os.path.join(OUT, fname)))

    # Headers that claim 10000x10000: edit the size fields of 1x1 files.
    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (9, 9, 9)).save(buf, format="JPEG")
    jpg = bytearray(buf.getvalue())
    sof = jpg.index(b"\xff\xc0")
    struct.pack_into(">HH", jpg, sof + 5, 10000, 10000)  # height, width
    with open(os.path.join(OUT, "bomb_10000x10000.jpg"), "wb") as f:
        f.write(jpg)
    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (9, 9, 9)).save(buf, format="PNG")
    png = bytearray(buf.getvalue())
    ihdr = png.index(b"IHDR")
    struct.pack_into(">II", png, ihdr + 4, 10000, 10000)
    struct.pack_into(">I", png, ihdr + 17, zlib.crc32(bytes(png[ihdr : ihdr + 17])))
    with open(os.path.join(OUT, "bomb_10000x10000.png"), "wb") as f:
        f.write(png)

    # Resize references from the lossless PNG (identical decode in both implementations).
    src = Image.open(os.path.join(OUT, "photo_png.png")).convert("RGB")
    box = (37, 21, 37 + 150, 21 + 125)
    out = src.crop(box).resize((112, 96), Image.BILINEAR, reducing_gap=None)
    save_ref("resize_crop_box.rgb", np.asarray(out), {"box_ltwh": [37, 21, 150, 125]})
    w, h = src.size
    short = 128
    nw, nh = (int(short * w / h), short) if w >= h else (short, int(short * h / w))
    resized = src.resize((nw, nh), Image.BILINEAR, reducing_gap=None)
    top, left = int(round((nh - 112) / 2.0)), int(round((nw - 112) / 2.0))
    out = resized.crop((left, top, left + 112, top + 112))
    save_ref("resize_center.rgb", np.asarray(out), {"resized": [nw, nh]})

    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total / 1e6:.2f} MB, into {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
