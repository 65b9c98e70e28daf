#!/usr/bin/env python3
"""stoker's packed format side by side with FFCV 1.0.2, in one run, on the same photos.

    bash bench/run.sh --packed            # installs FFCV too (see below), then this comparison
    python bench/compare_packed.py        # the same, once the venv and the photos exist
    python bench/compare_packed.py --images 320 --rounds 1   # a quick check on a subset

The photos are the images workload's (bench/.data/imagenet_like: ~500x375 JPEGs in ImageFolder
class folders), read as they are (stoker's image_folder, the baseline row) and written by each
tool, every write timed:
  stoker  `stoker pack` (the CLI at target/release/stoker, or $STOKER_CLI) with the original
          JPEGs, with --max-side 256 (shrunk, re-encoded as JPEG quality 90) and with
          --max-side 256 --mode raw (RGB8 pixels); RAYON_NUM_THREADS=2
  FFCV    ffcv.writer.DatasetWriter(num_workers=2) over torchvision's ImageFolder, with
          RGBImageField(write_mode="jpg", max_resolution=256, jpeg_quality=90) and
          RGBImageField(write_mode="raw", max_resolution=256), plus IntField labels
and read back through the standard ImageNet training pipeline, batches of 64 with the last
partial batch kept, shuffled, 2 workers:
  stoker  stoker.Loader("packed:PATH" or "image_folder:ROOT", transform=
          "random_resized_crop(224) | hflip | normalize(imagenet)", num_workers=2) -> float32
          NCHW, contiguous (the torch tensor of the batch, DLPack, no copy); 2 workers x the
          default prefetch_factor 2 = 4 batches in flight
  FFCV    ffcv.loader.Loader(num_workers=2, order=OrderOption.RANDOM, os_cache=True,
          drop_last=False, default batches_ahead=3) with RandomResizedCropRGBImageDecoder((224,
          224)) -> RandomHorizontalFlip() -> NormalizeImage(mean*255, std*255, np.float32) ->
          ToTensor() -> ToTorchImage() -> float32 of shape [64, 3, 224, 224] whose memory is
          channels-last (a permuted view of NHWC), labels IntDecoder -> ToTensor -> Squeeze

What differs, honestly:
  - NormalizeImage runs before ToTensor/ToTorchImage, not after as in FFCV's GPU ImageNet
    example: on the CPU it is a numba (jitted) operation, and the GPU order (jitted, then not,
    then jitted again) makes FFCV 1.0.2's Loader constructor loop forever in
    Graph.group_operations (libffcv/ffcv#396). The result is the same normalized float32 image.
  - FFCV hands over channels-last memory (NCHW shape, NHWC strides); stoker contiguous NCHW. A
    model in channels_last format takes FFCV's as it is; an NCHW one pays a copy not counted
    here.
  - The crops: stoker folds crop, resize and flip into one resample from the decoded image;
    FFCV's decoder crops and resizes with OpenCV (INTER_AREA), then flips. Both draw boxes with
    torchvision's RandomResizedCrop scale (0.08, 1) and ratio (3/4, 4/3).
  - Writing: FFCV decodes with Pillow (torchvision's ImageFolder), shrinks with OpenCV
    INTER_AREA and encodes with OpenCV; stoker pack decodes, shrinks and encodes itself. FFCV's
    write time is measured inside its process from constructing the DatasetWriter to its
    return (Python, torch and FFCV already imported); stoker's is the `stoker pack` command's
    wall time, process start included.
  - FFCV's file grows in whole pages of its DatasetWriter page_size (8 MiB by default, one open
    page per writer worker), so on a few hundred photos its size column is mostly padding.
  - FFCV's first batch includes numba compiling the pipeline (its Compiler uses njit without
    cache=True, so every process compiles again): that is what a training job pays at start.

Measured per row, in its own child process that imports torch first (as compare.py does):
  images/s     epochs 2 to 4 (the first, which includes the first batch, warms up); at a few
               thousand images/s one epoch of 1,280 photos lasts a fifth of a second, too short
               a window to time alone
  first batch  from constructing the loader to holding the first batch
  peak RSS     VmRSS summed over the child and its descendants (compare.py's sampler)
Every write and every loader runs ROUNDS times, interleaved; each metric keeps its best round
(a shared machine only ever makes a job slower). Ratios: "packed 256 = Nx" is the stoker
packed --max-side 256 row's images/s over the row's (the targets: >= 2x image_folder and
>= 1x FFCV jpg 256); "pack speed" is stoker pack's images/s over FFCV's writer's at the same
settings.

How FFCV 1.0.2 was installed into bench/.venv (Debian 12, Python 3.11; bench/run.sh --packed
does the same):
    apt-get install -y libturbojpeg0-dev libopencv-dev pkg-config   # its C extension's build
    bench/.venv/bin/pip freeze | grep -iE '^(numpy|torch|torchvision|pillow)==' >constraints.txt
    bench/.venv/bin/pip install -c constraints.txt ffcv==1.0.2
(Debian 12: libturbojpeg0-dev 2.1.5, libopencv-dev 4.6.0), which built ffcv from its source
distribution (pkg-config finds opencv4 and libturbojpeg; without them the build stops with
"Could not find required package: opencv") and brought numba 0.68.1, llvmlite 0.50.0,
opencv-python 5.0.0.93, pytorch-pfn-extras 0.9.0, fastargs 1.2.0, assertpy 1.1,
terminaltables 3.1.10 and tqdm, with numpy 2.4.6 and torch 2.15.0 left as they were.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from compare import DATA, HERE, IMAGES, MEAN, SPEC, STD, WORKERS, measure

ROUNDS = 3
BATCH = 64
MAX_SIDE = 256
JPEG_QUALITY = 90  # stoker pack's default --quality, given to FFCV explicitly
EPOCHS = 3  # measured, after the warm-up epoch

IMAGE_FOLDER = "stoker, image_folder"
PACKED_ORIGINAL = "stoker, packed (original JPEGs)"
PACKED = f"stoker, packed --max-side {MAX_SIDE}"
PACKED_RAW = f"stoker, packed --max-side {MAX_SIDE} --mode raw"
FFCV_JPG = f"FFCV 1.0.2, jpg, max_resolution={MAX_SIDE}"
FFCV_RAW = f"FFCV 1.0.2, raw, max_resolution={MAX_SIDE}"

# name -> (tool, file name under the output folder, writer arguments); image_folder has none.
ROWS = {
    IMAGE_FOLDER: ("stoker", None, None),
    PACKED_ORIGINAL: ("stoker", "original.stkpack", []),
    PACKED: ("stoker", "small.stkpack", ["--max-side", str(MAX_SIDE)]),
    PACKED_RAW: ("stoker", "raw.stkpack", ["--max-side", str(MAX_SIDE), "--mode", "raw"]),
    FFCV_JPG: ("ffcv", "small.beton", "jpg"),
    FFCV_RAW: ("ffcv", "raw.beton", "raw"),
}
# Which writes the pack-speed ratio compares: stoker's row -> FFCV's at the same settings.
SAME_SETTINGS = {PACKED: FFCV_JPG, PACKED_RAW: FFCV_RAW}


# ---------------------------------------------------------------------------------------------
# Child side: one write or one loader, JSON on the last line of stdout.


def ffcv_write(root: str, out: str, mode: str) -> dict:
    from torchvision.datasets import ImageFolder

    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    t = time.perf_counter()
    writer = DatasetWriter(
        out,
        {
            "image": RGBImageField(write_mode=mode, max_resolution=MAX_SIDE, jpeg_quality=JPEG_QUALITY),
            "label": IntField(),
        },
        num_workers=WORKERS,
    )
    writer.from_indexed_dataset(ImageFolder(root))
    return {"seconds": time.perf_counter() - t}


def stoker_load(source: str) -> dict:
    import stoker

    def make():
        loader = stoker.Loader(source, batch_size=BATCH, shuffle=True, transform=SPEC, num_workers=WORKERS)
        return lambda: iter(loader)

    return measure(make, lambda b: b.torch()["image"].shape[0], EPOCHS)


def ffcv_load(path: str) -> dict:
    import numpy as np

    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    mean, std = np.array(MEAN) * 255, np.array(STD) * 255

    def make():
        loader = Loader(
            path,
            batch_size=BATCH,
            num_workers=WORKERS,
            order=OrderOption.RANDOM,
            os_cache=True,
            drop_last=False,
            pipelines={
                "image": [
                    RandomResizedCropRGBImageDecoder((224, 224)),
                    RandomHorizontalFlip(),
                    NormalizeImage(mean, std, np.float32),
                    ToTensor(),
                    ToTorchImage(),
                ],
                "label": [IntDecoder(), ToTensor(), Squeeze()],
            },
        )
        return lambda: iter(loader)

    def batch_len(batch) -> int:
        images = batch[0]
        assert images.dtype.is_floating_point and tuple(images.shape[1:]) == (3, 224, 224), images.shape
        return images.shape[0]

    return measure(make, batch_len, EPOCHS)


def child(kind: str, *args: str) -> None:
    import torch  # noqa: F401  (the framework every row's process has loaded)

    run = {"ffcv-write": ffcv_write, "stoker-load": stoker_load, "ffcv-load": ffcv_load}[kind]
    print(json.dumps(run(*args)))


# ---------------------------------------------------------------------------------------------
# Parent side: the photos, the writes, the loaders, the table.


def subset(count: int) -> Path:
    """The first count/classes files of every class, as symlinks in a folder of their own (the
    same files for both tools)."""
    classes = sorted(d for d in IMAGES.iterdir() if d.is_dir())
    per_class = max(1, -(-count // len(classes)))
    root = DATA / f"imagenet_like-{per_class * len(classes)}"
    if (root / ".complete").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    for c in classes:
        (root / c.name).mkdir(parents=True)
        for f in sorted(c.glob("*.JPEG"))[:per_class]:
            (root / c.name / f.name).symlink_to(f.resolve())
    (root / ".complete").touch()
    return root


def size_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size if path.exists() else 0


def run_child(*args: str, timeout: int = 600) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write(name: str, root: Path, out_dir: Path) -> dict:
    """Writes one row's file; {"seconds", "bytes"} or {"error"}."""
    tool, file, how = ROWS[name]
    out = out_dir / file
    if out.is_dir():
        shutil.rmtree(out)
    elif out.exists():
        out.unlink()
    if tool == "ffcv":
        result = run_child("ffcv-write", str(root), str(out), how)
    else:
        cli = os.environ.get("STOKER_CLI", str(HERE.parent / "target" / "release" / "stoker"))
        cmd = [cli, "pack", f"image_folder:{root}", str(out), *how]
        t = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ, RAYON_NUM_THREADS=str(WORKERS))
        )
        seconds = time.perf_counter() - t
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": " | ".join(tail)}
        result = {"seconds": seconds}
    if "error" not in result:
        result["bytes"] = size_bytes(out)
    return result


def load(name: str, root: Path, out_dir: Path) -> dict:
    tool, file, _ = ROWS[name]
    if tool == "ffcv":
        return run_child("ffcv-load", str(out_dir / file))
    source = f"image_folder:{root}" if file is None else f"packed:{out_dir / file}"
    return run_child("stoker-load", source)


def keep_best(old: dict | None, new: dict) -> dict:
    """Per metric, the better of two rounds (a shared machine only ever slows a job down)."""
    if old is None or "error" in old:
        return new
    if "error" in new:
        return old
    better = dict(old)
    for key, value in new.items():
        if key == "samples_per_s":
            better[key] = max(old[key], value)
        elif key in ("first_batch_s", "peak_rss", "peak_pss", "seconds"):
            better[key] = min(old[key], value)
    return better


def table(loads: dict, writes: dict, samples: int, root: Path) -> str:
    mib = 2**20
    head = (
        f"{'row':<40} {'images/s':>9} {'first batch':>12} {'peak RSS':>9}"
        f" {'packed 256 =':>13} {'size MiB':>9} {'pack/write images/s':>20} {'pack speed':>11}"
    )
    lines = [head, "-" * len(head)]
    ours = loads.get(PACKED, {"error": "not run"})
    for name in ROWS:
        r = loads.get(name, {"error": "not run"})
        w = writes.get(name)
        if name == IMAGE_FOLDER:
            size, rate = f"{size_bytes(root) / mib:.1f}", "-"
        elif w is None or "error" in w:
            size, rate = "-", "failed" if w else "-"
        else:
            size, rate = f"{w['bytes'] / mib:.1f}", f"{samples / w['seconds']:.0f}"
        speed = ""
        theirs = writes.get(SAME_SETTINGS.get(name, ""))
        if w and theirs and "error" not in w and "error" not in theirs:
            speed = f"{theirs['seconds'] / w['seconds']:.2f}x"
        if "error" in r:
            lines.append(f"{name:<40} failed: {r['error']}")
            if rate != "-":
                lines.append(f"{'':<40} {'':>9} {'':>12} {'':>9} {'':>13} {size:>9} {rate:>20} {speed:>11}")
            continue
        ratio = "" if name == PACKED or "error" in ours else f"{ours['samples_per_s'] / r['samples_per_s']:.2f}x"
        lines.append(
            f"{name:<40} {r['samples_per_s']:>9.0f} {r['first_batch_s'] * 1000:>9.0f} ms"
            f" {r['peak_rss'] / mib:>5.0f} MiB {ratio:>13} {size:>9} {rate:>20} {speed:>11}"
        )
    return "\n".join(lines)


def targets(loads: dict, writes: dict) -> list[str]:
    def rate(name: str) -> float | None:
        r = loads.get(name, {})
        return r.get("samples_per_s")

    def secs(name: str) -> float | None:
        w = writes.get(name, {})
        return w.get("seconds")

    lines = []
    for label, a, b, goal in [
        ("load: packed 256 / image_folder", rate(PACKED), rate(IMAGE_FOLDER), 2.0),
        ("load: packed 256 / FFCV jpg 256", rate(PACKED), rate(FFCV_JPG), 1.0),
        ("load: packed raw / FFCV raw 256", rate(PACKED_RAW), rate(FFCV_RAW), 1.0),
        # Pack speed: FFCV's seconds over stoker's (both wrote the same number of images).
        ("write: stoker pack 256 / FFCV writer jpg 256", secs(FFCV_JPG), secs(PACKED), 1.0),
        ("write: stoker pack raw / FFCV writer raw 256", secs(FFCV_RAW), secs(PACKED_RAW), 1.0),
    ]:
        if a and b:
            verdict = "met" if a / b >= goal else "NOT met"
            lines.append(f"{label:<46} {a / b:>5.2f}x   (target >= {goal:g}x: {verdict})")
        else:
            lines.append(f"{label:<46} n/a (a row failed)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--images", type=int, default=0, help="use about this many of the photos (0: all)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved rounds, best kept ({ROUNDS})")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if not (IMAGES / ".complete").exists():
        raise SystemExit(f"{IMAGES} is missing: run bash bench/run.sh --packed, which builds it")
    root = subset(args.images) if args.images else IMAGES
    out_dir = DATA / ("packed" if not args.images else f"packed-{root.name}")
    out_dir.mkdir(parents=True, exist_ok=True)
    samples = sum(1 for _ in root.rglob("*.JPEG"))
    rounds = max(1, args.rounds)
    print(
        f"{os.cpu_count()} cores; {samples} JPEGs in {root}; {SPEC}; batch {BATCH}; {WORKERS} workers; "
        f"images/s of epochs 2-{EPOCHS + 1}; best of {rounds} round(s)",
        flush=True,
    )
    writes: dict = {}
    loads: dict = {}
    for round_ in range(rounds):
        for name in ROWS:
            if ROWS[name][1] is None:
                continue
            print(f"round {round_ + 1}/{rounds}: write {name} ...", flush=True)
            writes[name] = keep_best(writes.get(name), write(name, root, out_dir))
        for name in ROWS:
            if name != IMAGE_FOLDER and "error" in writes[name]:
                loads[name] = {"error": f"its write failed: {writes[name]['error']}"}
                continue
            print(f"round {round_ + 1}/{rounds}: load {name} ...", flush=True)
            loads[name] = keep_best(loads.get(name), load(name, root, out_dir))
    print()
    print(table(loads, writes, samples, root))
    print()
    print("\n".join(targets(loads, writes)))
    print(
        "\nFFCV differs in: channels-last float32 (NCHW shape, NHWC memory) vs stoker's contiguous "
        "NCHW; NormalizeImage before ToTensor/ToTorchImage (the CPU order FFCV 1.0.2 can build); "
        "OpenCV crop/resize; its first batch includes numba compiling the pipeline."
    )
    (DATA / "results-packed.json").write_text(json.dumps({"loads": loads, "writes": writes}, indent=1))


if __name__ == "__main__":
    main()
