#!/usr/bin/env python3
"""stoker beside torchvision v2 on dense tasks: image + mask and image + boxes, in one run.

    python bench/compare_dense.py [--json OUT] [--images N] [--rounds R]

Data (bench/.data/dense, made once, deterministic): N crops of 640x480 (one in five 480x640) cut
from the real photographs of Debian's mate-backgrounds package (bench/.data/photos, fetched with
`apt-get download` as bench/run.sh does), JPEG quality 90. Each photo gets 2 to 8 synthetic
objects, random polygons and rectangles of classes 1..20 painted into an 8-bit grayscale PNG
class mask of the photo's size (0: background), and one box per object (its bounding rectangle,
COCO's [x, y, w, h]) with its class as the label. The same bytes are stored twice over:
  dense/seg/images/K.jpg + dense/seg/masks/K.png   a segmentation folder
  dense/det-000000.tar                             K.jpg, K.png, K.json ({"boxes", "labels"})

Recipes (every loader: 2 workers, shuffled, 4 batches in flight per worker where it has the knob)
  segmentation  random_resized_crop(512) + hflip + normalize(imagenet) on image and mask:
                float32 [16, 3, 512, 512] images, int64 [16, 512, 512] masks
                stoker: segmentation_folder: source
                torchvision: a Dataset opening the same files with PIL, tv_tensors.Image/Mask,
                v2.RandomResizedCrop(512) + RandomHorizontalFlip + ToDtype + Normalize, default
                collate (stack)
  detection     scale_jitter(1024) (scale 0.1:2, torchvision's default) + random_crop(1024,
                padding=512) + hflip on image and boxes (xywh), uint8 [8, 3, 1024, 1024] images
                (detection models normalize on the device), boxes padded with -1 to the batch's
                most plus their counts
                stoker: the tar shard, fields=jpg:image,json#boxes:boxes,json#labels:labels
                torchvision: a Dataset reading the same tar members (offsets from tarfile) with
                PIL and json, tv_tensors.Image/BoundingBoxes, v2.ScaleJitter((1024, 1024)) +
                RandomCrop(1024, padding=512) + RandomHorizontalFlip + SanitizeBoundingBoxes,
                a collate_fn that stacks the images and pads the boxes the same way

Measured: samples/s over ROUNDS interleaved rounds (each loader in its own process that imports
torch first; per round one warm-up epoch, then the measured epochs; best round kept, since other
jobs on a shared machine only ever slow a loader down), and time to the first batch. Ratio =
stoker samples/s / torchvision's. Target of the issue: >= 3x for both recipes.

Determinism: stoker's batches of one epoch, hashed field by field, with num_workers=1 and 2 must
be byte-identical (same seed), for both recipes.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import tarfile
import time
from pathlib import Path

# The child-process runner of the main benchmark (bench/compare.py, beside this file). Its
# measure() also samples memory with psutil, which this benchmark does not need.
from compare import run_child

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
PHOTOS = DATA / "photos" / "usr" / "share" / "backgrounds" / "mate" / "nature"
DENSE = DATA / "dense"
SEG = DENSE / "seg"
TAR = DENSE / "det-000000.tar"

WORKERS = 2
ROUNDS = 2
EPOCHS = 2  # measured epochs per round, after one warm-up epoch
CHILD_TIMEOUT = 900  # seconds for one loader's child process (torchvision's rounds are slow)
PREFETCH = 4
SEG_BATCH, DET_BATCH = 16, 8
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SEED = 0

SEG_SPEC = "fields(image=image, mask=mask) | random_resized_crop(512) | hflip | normalize(imagenet)"
DET_FIELDS = "jpg:image,json#boxes:boxes,json#labels:labels"
DET_SPEC = (
    "fields(image=image, boxes=boxes:xywh, labels=labels)"
    " | scale_jitter(1024, scale=0.1:2) | random_crop(1024, padding=512) | hflip"
)

RUNS = [
    ("segmentation", "stoker"),
    ("segmentation", "torchvision v2"),
    ("detection", "stoker"),
    ("detection", "torchvision v2"),
]


# ---------------------------------------------------------------------------------------------
# Data


def make_data(count: int) -> None:
    """The photos' crops, their synthetic masks and boxes, as a segmentation folder and a tar
    shard holding the same bytes; a complete set of `count` images is left as it is."""
    done = DENSE / ".complete"
    if done.exists() and done.read_text() == str(count):
        return
    import numpy as np
    from PIL import Image, ImageDraw

    photos = sorted(PHOTOS.glob("*.jpg"))
    if len(photos) < 2:
        raise SystemExit(
            f"no photographs in {PHOTOS}: fetch them with\n"
            f"  mkdir -p {DATA / 'photos'} && cd {DATA / 'photos'} && "
            "apt-get download mate-backgrounds && dpkg -x mate-backgrounds_*.deb ."
        )
    rng = np.random.default_rng(SEED)
    sources = [Image.open(p).convert("RGB") for p in photos]
    (SEG / "images").mkdir(parents=True, exist_ok=True)
    (SEG / "masks").mkdir(parents=True, exist_ok=True)
    with tarfile.open(TAR, "w", format=tarfile.GNU_FORMAT) as tar:
        for k in range(count):
            src = sources[k % len(sources)]
            out = (480, 640) if rng.random() < 0.2 else (640, 480)  # (W, H)
            w, h = src.size
            aspect = out[0] / out[1]
            area = rng.uniform(0.2, 0.8) * w * h
            cw = min(w, int(round((area * aspect) ** 0.5)))
            ch = min(h, int(round(cw / aspect)))
            left, top = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
            photo = src.crop((left, top, left + cw, top + ch)).resize(out, Image.LANCZOS)
            mask = Image.new("L", out, 0)
            draw = ImageDraw.Draw(mask)
            boxes, labels = [], []
            for _ in range(int(rng.integers(2, 9))):
                label = int(rng.integers(1, 21))
                cx, cy = rng.uniform(0, out[0]), rng.uniform(0, out[1])
                rx, ry = rng.uniform(15, out[0] / 4), rng.uniform(15, out[1] / 4)
                if rng.random() < 0.5:
                    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 9))))
                    radii = rng.uniform(0.5, 1.0, len(angles))
                    xs, ys = cx + rx * radii * np.cos(angles), cy + ry * radii * np.sin(angles)
                else:
                    xs, ys = np.array([cx - rx, cx + rx]), np.array([cy - ry, cy + ry])
                xs, ys = np.clip(xs, 0, out[0] - 1), np.clip(ys, 0, out[1] - 1)
                if len(xs) == 2:
                    draw.rectangle([float(xs[0]), float(ys[0]), float(xs[1]), float(ys[1])], fill=label)
                else:
                    draw.polygon([(float(x), float(y)) for x, y in zip(xs, ys)], fill=label)
                x0, y0 = float(np.floor(xs.min())), float(np.floor(ys.min()))
                x1, y1 = float(np.ceil(xs.max())) + 1, float(np.ceil(ys.max())) + 1
                boxes.append([x0, y0, min(x1, out[0]) - x0, min(y1, out[1]) - y0])
                labels.append(label)
            members = {}
            b = io.BytesIO()
            photo.save(b, "JPEG", quality=90)
            members["jpg"] = b.getvalue()
            b = io.BytesIO()
            mask.save(b, "PNG")
            members["png"] = b.getvalue()
            members["json"] = json.dumps({"boxes": boxes, "labels": labels}).encode()
            key = f"{k:06d}"
            (SEG / "images" / f"{key}.jpg").write_bytes(members["jpg"])
            (SEG / "masks" / f"{key}.png").write_bytes(members["png"])
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    done.write_text(str(count))


# ---------------------------------------------------------------------------------------------
# Child side: one loader, JSON on stdout.


def measure(make_epoch, batch_len) -> dict:
    t0 = time.perf_counter()
    epoch = make_epoch()
    it = epoch()
    n = batch_len(next(it))
    first_batch = time.perf_counter() - t0
    for b in it:  # the rest of the warm-up epoch
        n += batch_len(b)
    per_epoch = n
    t1 = time.perf_counter()
    for _ in range(EPOCHS):
        n = sum(batch_len(b) for b in epoch())
        assert n == per_epoch, f"an epoch gave {n} samples, the warm-up {per_epoch}"
    elapsed = time.perf_counter() - t1
    return {
        "samples_per_s": EPOCHS * per_epoch / elapsed,
        "first_batch_s": first_batch,
        "samples_measured": EPOCHS * per_epoch,
    }


def stoker_loader(recipe: str, workers: int):
    import stoker

    common = dict(shuffle=True, seed=SEED, num_workers=workers, prefetch_factor=PREFETCH)
    if recipe == "segmentation":
        return stoker.Loader(
            f"segmentation_folder:{SEG}", batch_size=SEG_BATCH, transform=SEG_SPEC, **common
        )
    return stoker.Loader(
        f"tar:{TAR}", batch_size=DET_BATCH, fields=DET_FIELDS, pad=-1, transform=DET_SPEC, **common
    )


def stoker_run(recipe: str) -> dict:
    def make():
        loader = stoker_loader(recipe, WORKERS)
        return lambda: iter(loader)

    # The trainer gets torch tensors, as from torchvision's loader (DLPack, no copy).
    return measure(make, lambda b: b.torch()["image"].shape[0])


class SegFiles:
    """The segmentation folder through PIL: (tv_tensors.Image, tv_tensors.Mask) per sample."""

    def __init__(self, transform):
        self.names = sorted(p.stem for p in (SEG / "images").glob("*.jpg"))
        self.transform = transform

    def __len__(self):
        return len(self.names)

    def __getitem__(self, i):
        import numpy as np
        import torch
        from PIL import Image
        from torchvision import tv_tensors
        from torchvision.transforms.v2 import functional as F

        name = self.names[i]
        with Image.open(SEG / "images" / f"{name}.jpg") as im:
            image = tv_tensors.Image(F.pil_to_tensor(im.convert("RGB")))
        with Image.open(SEG / "masks" / f"{name}.png") as im:
            mask = tv_tensors.Mask(torch.from_numpy(np.array(im)))
        return self.transform(image, mask)


class DetTar:
    """The tar shard's members through PIL and json, read at the offsets tarfile lists:
    {"image": tv_tensors.Image, "boxes": tv_tensors.BoundingBoxes (XYWH), "labels"}."""

    def __init__(self, transform):
        members: dict[str, dict[str, tuple[int, int]]] = {}
        with tarfile.open(TAR) as tar:
            for m in tar.getmembers():
                key, ext = m.name.split(".", 1)
                members.setdefault(key, {})[ext] = (m.offset_data, m.size)
        self.samples = [members[k] for k in sorted(members)]
        self.transform = transform
        self.file = None

    def __len__(self):
        return len(self.samples)

    def read(self, where):
        if self.file is None:  # one handle per worker process
            self.file = open(TAR, "rb")
        self.file.seek(where[0])
        return self.file.read(where[1])

    def __getitem__(self, i):
        import torch
        from PIL import Image
        from torchvision import tv_tensors
        from torchvision.transforms.v2 import functional as F

        sample = self.samples[i]
        with Image.open(io.BytesIO(self.read(sample["jpg"]))) as im:
            image = tv_tensors.Image(F.pil_to_tensor(im.convert("RGB")))
        ann = json.loads(self.read(sample["json"]))
        boxes = tv_tensors.BoundingBoxes(
            torch.tensor(ann["boxes"], dtype=torch.float32).reshape(-1, 4),
            format="XYWH",
            canvas_size=tuple(image.shape[-2:]),
        )
        labels = torch.tensor(ann["labels"], dtype=torch.int64)
        return self.transform({"image": image, "boxes": boxes, "labels": labels})


def pad_boxes(samples):
    """Images stacked; boxes and labels padded with -1 to the batch's most, with the counts:
    the layout of stoker's pad=-1 batches."""
    import torch

    lengths = torch.tensor([len(s["labels"]) for s in samples], dtype=torch.int64)
    most = int(lengths.max()) if len(samples) else 0
    boxes = torch.full((len(samples), most, 4), -1.0)
    labels = torch.full((len(samples), most), -1, dtype=torch.int64)
    for i, s in enumerate(samples):
        boxes[i, : lengths[i]] = s["boxes"].as_subclass(torch.Tensor)
        labels[i, : lengths[i]] = s["labels"]
    images = torch.stack([s["image"].as_subclass(torch.Tensor) for s in samples])
    return {"image": images, "boxes": boxes, "boxes_lengths": lengths, "labels": labels}


def torchvision_run(recipe: str) -> dict:
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    if recipe == "segmentation":
        transform = v2.Compose([
            v2.RandomResizedCrop(512, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64}, scale=True),
            v2.Normalize(MEAN, STD),
        ])
        dataset, collate, batch = SegFiles(transform), None, SEG_BATCH
    else:
        transform = v2.Compose([
            v2.ScaleJitter((1024, 1024), scale_range=(0.1, 2.0), antialias=True),
            v2.RandomCrop(1024, padding=512),
            v2.RandomHorizontalFlip(),
            v2.SanitizeBoundingBoxes(min_size=1),
        ])
        dataset, collate, batch = DetTar(transform), pad_boxes, DET_BATCH

    def make():
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch,
            shuffle=True,
            num_workers=WORKERS,
            persistent_workers=True,
            prefetch_factor=PREFETCH,
            collate_fn=collate,
        )
        return lambda: iter(loader)

    first = (lambda b: b[0].shape[0]) if recipe == "segmentation" else (lambda b: b["image"].shape[0])
    return measure(make, first)


def digests(recipe: str, workers: int) -> list[str]:
    """One epoch of stoker batches, each field's bytes hashed, batch by batch."""
    import numpy as np

    loader = stoker_loader(recipe, workers)
    out = []
    for batch in loader:
        h = hashlib.sha256()
        for name in sorted(batch):
            a = np.ascontiguousarray(batch[name])
            h.update(f"{name}{a.dtype}{a.shape}".encode())
            h.update(a.tobytes())
        out.append(h.hexdigest())
    loader.close()
    return out


def child(recipe: str, name: str) -> None:
    import torch  # noqa: F401  (every child carries the framework, as a training job does)

    if name == "stoker":
        result = stoker_run(recipe)
    elif name == "torchvision v2":
        result = torchvision_run(recipe)
    elif name.startswith("digests "):
        result = {"digests": digests(recipe, int(name.split()[1]))}
    else:
        raise SystemExit(f"unknown loader {name!r}")
    print(json.dumps(result))


def best(a: dict | None, b: dict) -> dict:
    if a is None or "error" in a:
        return b
    if "error" in b:
        return a
    return dict(
        a,
        samples_per_s=max(a["samples_per_s"], b["samples_per_s"]),
        first_batch_s=min(a["first_batch_s"], b["first_batch_s"]),
    )


def main() -> None:
    global ROUNDS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("RECIPE", "LOADER"), help=argparse.SUPPRESS)
    parser.add_argument("--images", type=int, default=256, help="photos in the data set (default 256)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (default {ROUNDS})")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    ROUNDS = args.rounds
    make_data(args.images)
    print(f"{os.cpu_count()} cores; {args.images} photos of 640x480 with synthetic masks and boxes in "
          f"{DENSE}; {WORKERS} workers each", flush=True)
    results: dict = {}
    for round_ in range(ROUNDS):
        for recipe, name in RUNS:
            print(f"round {round_ + 1}/{ROUNDS}: {recipe}: {name} ...", flush=True)
            result = run_child(recipe, name, __file__, CHILD_TIMEOUT)
            results[(recipe, name)] = best(results.get((recipe, name)), result)
    determinism = {}
    for recipe in ("segmentation", "detection"):
        print(f"determinism: {recipe}: stoker with 1 and {WORKERS} workers ...", flush=True)
        one = run_child(recipe, "digests 1", __file__, CHILD_TIMEOUT)
        many = run_child(recipe, f"digests {WORKERS}", __file__, CHILD_TIMEOUT)
        if "error" in one or "error" in many:
            determinism[recipe] = {"error": one.get("error") or many.get("error")}
        else:
            determinism[recipe] = {
                "batches": len(one["digests"]),
                "identical": one["digests"] == many["digests"] and len(one["digests"]) > 0,
            }

    print()
    head = f"{'recipe':<13} {'loader':<16} {'samples/s':>10} {'first batch':>12}   stoker speed"
    lines = [head, "-" * len(head)]
    for recipe in ("segmentation", "detection"):
        ours = results[(recipe, "stoker")]
        for name in ("stoker", "torchvision v2"):
            r = results[(recipe, name)]
            if "error" in r:
                lines.append(f"{recipe:<13} {name:<16} failed: {r['error']}")
                continue
            ratio = ""
            if name != "stoker" and "error" not in ours:
                ratio = f"   {ours['samples_per_s'] / r['samples_per_s']:>11.2f}x"
            lines.append(f"{recipe:<13} {name:<16} {r['samples_per_s']:>10.1f}"
                         f" {r['first_batch_s'] * 1000:>9.0f} ms{ratio}")
    for recipe, d in determinism.items():
        if "error" in d:
            lines.append(f"{recipe:<13} determinism: failed: {d['error']}")
        else:
            verdict = "byte-identical" if d["identical"] else "DIFFERENT"
            lines.append(f"{recipe:<13} determinism: {d['batches']} batches with 1 and {WORKERS} "
                         f"workers: {verdict}")
    print("\n".join(lines))
    if args.json:
        report = {
            "cores": os.cpu_count(),
            "images": args.images,
            "workers": WORKERS,
            "rounds": ROUNDS,
            "specs": {"segmentation": SEG_SPEC, "detection": DET_SPEC},
            "results": {f"{rec}/{n}": r for (rec, n), r in results.items()},
            "speedup": {
                rec: results[(rec, "stoker")]["samples_per_s"] / results[(rec, "torchvision v2")]["samples_per_s"]
                for rec in ("segmentation", "detection")
                if "error" not in results[(rec, "stoker")] and "error" not in results[(rec, "torchvision v2")]
            },
            "determinism": determinism,
        }
        Path(args.json).write_text(json.dumps(report, indent=1))
    failed = [d for d in determinism.values() if "error" in d or not d["identical"]]
    if failed:
        raise SystemExit("stoker's batches differ between 1 and 2 workers (see above)")


if __name__ == "__main__":
    main()
