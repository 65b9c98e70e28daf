#!/usr/bin/env python3
"""stoker side by side with its peers, in one run, on the same data (see bench/run.sh).

Workloads
  images  bench/.data/imagenet_like (real photos, ~500x375 JPEG) -> random_resized_crop(224)
          + hflip + normalize(imagenet), float32 NCHW, shuffled batches of 64
  npy     uint8 [2048, 3, 224, 224] .npy with int64 labels, shuffled batches of 256
  tar     the same photos as WebDataset shards (bench/.data/shards, written by
          webdataset.TarWriter, 8 shards), same transform and batches: stoker streaming
          (shuffle_buffer=1000) against stoker indexed, stoker image_folder on the folder, and
          webdataset + torch DataLoader (shard shuffle, shuffle(1000), PIL + torchvision
          transforms, 2 workers)
  parquet (not in the default set: --workloads parquet) the same photos as a Hugging Face image
          dataset's Parquet files (bench/.data/parquet, written by pyarrow as earlier releases of
          `datasets` wrote them: an `image` struct<bytes, path>, an int64 `label`, row groups of
          100, pyarrow's defaults otherwise, so one snappy page per row group), same transform
          and batches: stoker `parquet:` (shuffled: order=random, the default 1 GiB
          parquet_cache), the same with parquet_cache=0 and with order=quasi_random, stoker
          image_folder on the folder, and Hugging Face `datasets` (load_dataset("parquet"),
          with_transform: its Image feature's PIL decode and the torchvision transforms) in torch
          DataLoader, 2 workers

Each workload has a second stoker row, "stoker, Python dataset": the same loader fed by a
map-style Python object instead of a built-in source (images: __getitem__ opens and reads the
ImageFolder file in Python and returns (jpeg_bytes, label); npy: the MmapNpy dataset torch
DataLoader gets, returning (array_row, label)). Decoding and transforms still run in stoker's
threads, but every sample goes through a Python callback that holds the GIL, so those callbacks
run one at a time whatever num_workers is.

Every loader runs in its own subprocess (so memory is attributable and no loader warms
another's caches in-process), with 2 workers / threads and, where the peer has the knob, the
same number of batches in flight as stoker. Each child imports torch first, as a training job
would, so every row carries the same framework baseline.

Measured per loader
  samples/s    steady state: epochs after one warm-up epoch (which includes the first batch)
  first batch  from constructing the dataset and loader to holding the first batch
  peak RSS     sum of VmRSS over the child and all its descendants (the workers), sampled from
               /proc/<pid>/status every 20 ms by a thread of the child; pages shared between
               processes (torch's libraries in forked workers, a shared mmap) count once per
               process, as `ps` would show them
  peak PSS     the same sum of Pss (/proc/<pid>/smaps_rollup, every 100 ms): shared pages
               divided between the processes sharing them, i.e. the memory the job occupies
Every loader and limit runs ROUNDS times, interleaved, and each metric keeps its best round:
on a shared machine other jobs only ever make a loader slower or bigger.
Ratios are the built-in stoker row's: speed = stoker samples/s / peer's (higher is better);
first batch and RSS = stoker / peer (lower is better). On the "stoker, Python dataset" row they
compare the built-in source with the Python one (speed 1.50x: the Python dataset delivers 2/3 of
the built-in source's samples/s); the line marked * under each workload gives that row's own
ratios: its fraction of the built-in row's samples/s and its speed / each peer's.

Augmentation (--augment): the timm-like recipe random_resized_crop(224) + hflip +
TrivialAugmentWide + RandomErasing(p=0.25) + normalize, float32 NCHW, on the same photos: stoker
against torchvision v2 (decode_jpeg + transforms.v2) in torch DataLoader with 2 workers, in one
run, interleaved ROUNDS times (best kept); prints samples/s and stoker's speed ratio.

Packed format (--packed): stoker's image_folder and packed files (original JPEGs, --max-side
256, --max-side 256 --mode raw) against FFCV 1.0.2's .beton files at the same settings, written
and read in one run; see bench/compare_packed.py.

Porting (--porting): torchvision's ImageFolder in torch DataLoader (PIL, torchvision
transforms, 2 worker processes) against the same dataset object handed to
stoker.torch.DataLoader with the stoker transform: ImageFolder(root) with no transform, which
stoker reads natively (image_folder); the same ImageFolder's __getitem__ behind a plain wrapper
(PIL images decoded in Python, stoker's transform: the callback path), the same with
concurrent_getitem=True (the calls overlap where Pillow releases the GIL); and ImageFolder with its
torchvision transforms left in place (everything in Python, under one GIL). Same photos, batches
and transform as the images workload, one run of ROUNDS interleaved rounds (best kept).

Limits, same run: memcpy bandwidth (NumPy copy of one npy batch, one thread) for the npy
workload; for the images, decode-only throughput of Pillow (libjpeg-turbo, 2 processes, reading
the files) and of the fastest whole-image decoder of `stoker bench decoders` (zune-jpeg,
libjpeg-turbo or Pillow, from memory, 2 threads; the stoker CLI at target/release/stoker, or
$STOKER_CLI). A loader that decodes only the crop can beat both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / ".data"
IMAGES = DATA / "imagenet_like"
NPY, NPY_LABELS = DATA / "npy" / "data.npy", DATA / "npy" / "labels.npy"
NPY_SHAPE = (2048, 3, 224, 224)

WORKERS = 2
ROUNDS = 3  # every loader (and limit) runs this many times, interleaved; best kept
IMAGE_BATCH, IMAGE_PREFETCH, IMAGE_EPOCHS = 64, 4, 3
NPY_BATCH, NPY_PREFETCH, NPY_EPOCHS = 256, 2, 5
SPEC = "random_resized_crop(224) | hflip | normalize(imagenet)"
# The timm-like recipe (--augment); random_erasing runs on the normalized tensor in both.
AUG_SPEC = "random_resized_crop(224) | hflip | trivial_augment | random_erasing(p=0.25) | normalize(imagenet)"
AUG_EPOCHS = 2
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# RSS of a child that only imports torch: the floor under every row's peak RSS.
BASELINE = "python + torch, no loader"

# The stoker rows fed by a Python dataset (map-style, callbacks under the GIL).
PY_DATASET = "stoker, Python dataset"

# (workload, loader) pairs, stoker first in each workload.
RUNS = [
    ("images", "stoker"),
    ("images", PY_DATASET),
    ("images", "torch DataLoader (PIL)"),
    ("images", "torchvision decode_jpeg + v2"),
    ("images", "DALI CPU"),
    ("npy", "stoker"),
    ("npy", PY_DATASET),
    ("npy", "torch DataLoader (mmap)"),
    ("tar", "stoker"),
    ("tar", "stoker, tar indexed"),
    ("tar", "stoker, image_folder"),
    ("tar", "webdataset + torch DataLoader"),
    ("parquet", "stoker"),
    ("parquet", "stoker, parquet_cache=0"),
    ("parquet", "stoker, order=quasi_random"),
    ("parquet", "stoker, image_folder"),
    ("parquet", "HF datasets + torch DataLoader"),
]
SHARDS = DATA / "shards"
NUM_SHARDS = 8
TAR_PATTERN = f"{SHARDS}/train-{{000000..{NUM_SHARDS - 1:06d}}}.tar"
TAR_SHUFFLE_BUFFER = 1000
PARQUET = DATA / "parquet"
PARQUET_FILES = 2
PARQUET_PATTERN = f"{PARQUET}/train-{{00000..{PARQUET_FILES - 1:05d}}}-of-{PARQUET_FILES:05d}.parquet"


# ---------------------------------------------------------------------------------------------
# Child side: build one loader, run it, report JSON.


class RssSampler(threading.Thread):
    """Peaks of the summed VmRSS and Pss of this process and all its descendants.

    RSS counts a page shared by several processes (torch's libraries in forked workers, a
    shared mmap) once per process; Pss splits it between them, so its sum is what the job
    really occupies. Pss (smaps_rollup) costs more to read: it is sampled every 5th tick.
    """

    def __init__(self):
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.peak = self.peak_pss = 0
        self.ticks = 0
        self.stop_event = threading.Event()

    @staticmethod
    def proc_kb(pid: int, file: str, key: str) -> int:
        try:
            with open(f"/proc/{pid}/{file}") as f:
                for line in f:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except OSError:  # the process ended between listing and reading
            pass
        return 0

    def sample(self, pss: bool = True) -> None:
        pids = [self.me.pid] + [c.pid for c in self.me.children(recursive=True)]
        self.peak = max(self.peak, sum(self.proc_kb(p, "status", "VmRSS:") for p in pids))
        if pss:
            total = sum(self.proc_kb(p, "smaps_rollup", "Pss:") for p in pids)
            self.peak_pss = max(self.peak_pss, total)

    def run(self) -> None:
        while not self.stop_event.wait(0.02):
            self.ticks += 1
            self.sample(pss=self.ticks % 5 == 0)

    def stop(self) -> tuple[int, int]:
        self.stop_event.set()
        self.join()
        self.sample()
        return self.peak, self.peak_pss


def measure(make_epoch, batch_len, epochs: int) -> dict:
    """make_epoch() constructs the loader and returns a function giving one epoch's iterator."""
    sampler = RssSampler()
    sampler.start()
    t0 = time.perf_counter()
    epoch = make_epoch()
    it = epoch()
    n = batch_len(next(it))
    first_batch = time.perf_counter() - t0
    for b in it:  # the rest of the warm-up epoch
        n += batch_len(b)
    samples_per_epoch = n
    t1 = time.perf_counter()
    for _ in range(epochs):
        n = sum(batch_len(b) for b in epoch())
        assert n == samples_per_epoch, (n, samples_per_epoch)
    elapsed = time.perf_counter() - t1
    peak_rss, peak_pss = sampler.stop()
    return {
        "samples_per_s": epochs * samples_per_epoch / elapsed,
        "first_batch_s": first_batch,
        "peak_rss": peak_rss,
        "peak_pss": peak_pss,
        "samples_per_epoch": samples_per_epoch,
        "epochs": epochs,
    }


def stoker_images(source=None, spec=SPEC, epochs=IMAGE_EPOCHS, **options):
    import stoker

    def make():
        loader = stoker.Loader(
            f"image_folder:{IMAGES}" if source is None else source(),
            batch_size=IMAGE_BATCH,
            shuffle=True,
            transform=spec,
            num_workers=WORKERS,
            prefetch_factor=IMAGE_PREFETCH,
            **options,
        )
        return lambda: iter(loader)

    # The trainer gets torch tensors, as from the torch peers (DLPack, no copy).
    return measure(make, lambda b: b.torch()["image"].shape[0], epochs)


class JpegFiles:
    """Map-style dataset over the ImageFolder tree (classes = sorted subfolders) whose
    __getitem__ reads the file in Python and returns (jpeg_bytes, label): stoker decodes and
    transforms, but every sample passes through a Python callback under the GIL."""

    def __init__(self):
        classes = sorted(d.name for d in IMAGES.iterdir() if d.is_dir())
        self.samples = [
            (str(f), label)
            for label, c in enumerate(classes)
            for f in sorted((IMAGES / c).iterdir())
            if f.suffix == ".JPEG"
        ]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return f.read(), label


def stoker_py_images():
    return stoker_images(JpegFiles)


def torch_transform():
    """SPEC as torchvision transforms on a PIL image."""
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def torch_image_loader(dataset):
    """torch DataLoader as the image rows run it: shuffled batches, persistent worker processes,
    as many batches in flight as stoker."""
    import torch

    return torch.utils.data.DataLoader(
        dataset,
        batch_size=IMAGE_BATCH,
        shuffle=True,
        num_workers=WORKERS,
        persistent_workers=True,
        prefetch_factor=IMAGE_PREFETCH,
    )


def torch_pil_images():
    from torchvision.datasets import ImageFolder

    def make():
        loader = torch_image_loader(ImageFolder(str(IMAGES), transform=torch_transform()))
        return lambda: iter(loader)

    return measure(make, lambda b: b[0].shape[0], IMAGE_EPOCHS)


# The --porting rows: torch's loader, then the same ImageFolder object in stoker.torch.DataLoader.
PORTING_TORCH = "torch DataLoader (PIL)"
PORTING_RUNS = [
    PORTING_TORCH,
    "stoker.torch, ImageFolder (native)",
    "stoker.torch, ImageFolder PIL callback",
    "stoker.torch, PIL callback, concurrent",
    "stoker.torch, ImageFolder + T transforms",
]


class PlainDataset:
    """An ImageFolder's __getitem__ behind an object stoker does not recognise: the PIL images
    it returns go through the callback path."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        return self.dataset[i]


def porting_stoker(kind: str):
    from torchvision.datasets import ImageFolder

    import stoker.torch

    def make():
        options = {"transform": SPEC}
        if kind == "native":
            dataset = ImageFolder(str(IMAGES))
        elif kind == "callback":
            dataset = PlainDataset(ImageFolder(str(IMAGES)))
        elif kind == "concurrent":
            # ImageFolder opens each file in its own call: safe to call from several threads.
            dataset = PlainDataset(ImageFolder(str(IMAGES)))
            options["concurrent_getitem"] = True
        else:
            dataset, options = ImageFolder(str(IMAGES), transform=torch_transform()), {}
        loader = stoker.torch.DataLoader(
            dataset,
            batch_size=IMAGE_BATCH,
            shuffle=True,
            num_workers=WORKERS,
            prefetch_factor=IMAGE_PREFETCH,
            **options,
        )
        native = "source" in loader.loader.options
        assert native == (kind == "native"), (kind, loader.loader.options)
        return lambda: iter(loader)

    return measure(make, lambda b: b[0].shape[0], IMAGE_EPOCHS)


def decode_jpeg_file(path: str):
    """torchvision's own JPEG path (libjpeg-turbo into a uint8 CHW tensor), no PIL."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def torchvision_v2_images(augment: bool = False):
    import torch
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    def make():
        ops = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
        if augment:
            ops.append(v2.TrivialAugmentWide())
        ops += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
        if augment:
            ops.append(v2.RandomErasing(p=0.25))
        transform = v2.Compose(ops)
        loader = torch.utils.data.DataLoader(
            ImageFolder(str(IMAGES), loader=decode_jpeg_file, transform=transform),
            batch_size=IMAGE_BATCH,
            shuffle=True,
            num_workers=WORKERS,
            persistent_workers=True,
            prefetch_factor=IMAGE_PREFETCH,
        )
        return lambda: iter(loader)

    return measure(make, lambda b: b[0].shape[0], AUG_EPOCHS if augment else IMAGE_EPOCHS)


def dali_images():
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=IMAGE_BATCH, num_threads=WORKERS, device_id=None)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=str(IMAGES), random_shuffle=True, name="Reader")
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.random_resized_crop(images, size=224)
        # The flip is fused into crop_mirror_normalize (its `mirror`), as DALI's own ResNet
        # example does: the fastest way DALI offers, rather than a separate fn.flip pass.
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(),
        )
        return images, labels

    def make():
        pipe = pipeline(prefetch_queue_depth=IMAGE_PREFETCH)
        pipe.build()
        batches = -(-pipe.epoch_size("Reader") // IMAGE_BATCH)
        # One contiguous float32 NCHW batch, like the other loaders deliver.
        return lambda: (pipe.run()[0].as_tensor() for _ in range(batches))

    return measure(make, lambda b: b.shape()[0], IMAGE_EPOCHS)


def stoker_npy(python_dataset: bool = False):
    import stoker

    def make():
        # The Python dataset is the very MmapNpy object torch DataLoader gets.
        if python_dataset:
            source = dict(source=MmapNpy())
        else:
            source = dict(source=f"npy:{NPY}", labels=f"npy:{NPY_LABELS}")
        loader = stoker.Loader(
            **source,
            batch_size=NPY_BATCH,
            shuffle=True,
            num_workers=WORKERS,
            prefetch_factor=NPY_PREFETCH,
        )
        return lambda: iter(loader)

    return measure(make, lambda b: b.torch()["data"].shape[0], NPY_EPOCHS)


class MmapNpy:
    """Map-style dataset over np.load(mmap_mode='r'): the usual way to serve a big .npy."""

    def __init__(self):
        import numpy as np

        self.data = np.load(NPY, mmap_mode="r")
        self.labels = np.load(NPY_LABELS, mmap_mode="r")

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], self.labels[i]


def stoker_py_npy():
    return stoker_npy(python_dataset=True)


def torch_npy():
    import torch

    def make():
        loader = torch.utils.data.DataLoader(
            MmapNpy(),
            batch_size=NPY_BATCH,
            shuffle=True,
            num_workers=WORKERS,
            persistent_workers=True,
            prefetch_factor=NPY_PREFETCH,
        )
        return lambda: iter(loader)

    return measure(make, lambda b: b[0].shape[0], NPY_EPOCHS)


def stoker_tar_streaming():
    return stoker_images(lambda: f"tar:{TAR_PATTERN}", shuffle_buffer=TAR_SHUFFLE_BUFFER)


def stoker_tar_indexed():
    return stoker_images(lambda: f"tar:{TAR_PATTERN}")


def webdataset_torch():
    """WebDataset's documented recipe: shards shuffled, a shuffle buffer, PIL decode and the
    torchvision transforms in each of 2 worker processes, batched in the workers."""
    import torch
    import webdataset as wds

    def make():
        transform = torch_transform()
        dataset = (
            wds.WebDataset(TAR_PATTERN, shardshuffle=NUM_SHARDS, empty_check=False)
            .shuffle(TAR_SHUFFLE_BUFFER)
            .decode("pil")
            .to_tuple("jpg", "cls")
            .map_tuple(transform, lambda c: c)
            .batched(IMAGE_BATCH)
        )
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=None,
            num_workers=WORKERS,
            persistent_workers=True,
            prefetch_factor=IMAGE_PREFETCH,
        )
        return lambda: iter(loader)

    return measure(make, lambda b: b[0].shape[0], IMAGE_EPOCHS)


def stoker_parquet(**options):
    return stoker_images(lambda: f"parquet:{PARQUET_PATTERN}", **options)


def hf_datasets_torch():
    """The Hugging Face image-classification recipe: load_dataset("parquet") (converted once to
    its Arrow cache, memory-mapped), with_transform decoding the Image feature with PIL and
    applying the torchvision transforms, in torch DataLoader with 2 worker processes."""
    import datasets

    def make():
        transform = torch_transform()

        def batch_transform(rows):
            rows["image"] = [transform(image.convert("RGB")) for image in rows["image"]]
            return rows

        files = sorted(str(f) for f in PARQUET.glob("train-*.parquet"))
        dataset = datasets.load_dataset(
            "parquet", data_files=files, split="train", cache_dir=str(DATA / "hf-cache")
        ).with_transform(batch_transform)
        loader = torch_image_loader(dataset)
        return lambda: iter(loader)

    return measure(make, lambda b: b["image"].shape[0], IMAGE_EPOCHS)


CHILDREN = {
    ("images", "stoker"): stoker_images,
    ("images", PY_DATASET): stoker_py_images,
    ("images", "torch DataLoader (PIL)"): torch_pil_images,
    ("images", "torchvision decode_jpeg + v2"): torchvision_v2_images,
    ("images", "DALI CPU"): dali_images,
    ("npy", "stoker"): stoker_npy,
    ("npy", PY_DATASET): stoker_py_npy,
    ("npy", "torch DataLoader (mmap)"): torch_npy,
    ("tar", "stoker"): stoker_tar_streaming,
    ("tar", "stoker, tar indexed"): stoker_tar_indexed,
    ("tar", "stoker, image_folder"): stoker_images,
    ("tar", "webdataset + torch DataLoader"): webdataset_torch,
    ("parquet", "stoker"): stoker_parquet,
    ("parquet", "stoker, parquet_cache=0"): lambda: stoker_parquet(parquet_cache="0"),
    ("parquet", "stoker, order=quasi_random"): lambda: stoker_parquet(order="quasi_random"),
    ("parquet", "stoker, image_folder"): stoker_images,
    ("parquet", "HF datasets + torch DataLoader"): hf_datasets_torch,
    ("porting", PORTING_TORCH): torch_pil_images,
    ("porting", PORTING_RUNS[1]): lambda: porting_stoker("native"),
    ("porting", PORTING_RUNS[2]): lambda: porting_stoker("callback"),
    ("porting", PORTING_RUNS[3]): lambda: porting_stoker("concurrent"),
    ("porting", PORTING_RUNS[4]): lambda: porting_stoker("torchvision"),
    ("augment", "stoker"): lambda: stoker_images(spec=AUG_SPEC, epochs=AUG_EPOCHS),
    ("augment", "torchvision decode_jpeg + v2"): lambda: torchvision_v2_images(augment=True),
}


def child(workload: str, name: str) -> None:
    import torch  # noqa: F401  (the framework every row's process has loaded)

    if name == BASELINE:
        sampler = RssSampler()
        sampler.sample()
        print(json.dumps({"peak_rss": sampler.peak, "peak_pss": sampler.peak_pss}))
    else:
        print(json.dumps(CHILDREN[(workload, name)]()))


# ---------------------------------------------------------------------------------------------
# Parent side: data, limits, one subprocess per loader, the table.


def make_shards() -> None:
    """The photos as WebDataset shards, written by webdataset's own TarWriter (key, jpg, cls),
    in a fixed shuffled order so that every shard holds every class."""
    if (SHARDS / ".complete").exists():
        return
    import random

    import webdataset as wds

    classes = sorted(d.name for d in IMAGES.iterdir() if d.is_dir())
    files = [(f, label) for label, c in enumerate(classes) for f in sorted((IMAGES / c).glob("*.JPEG"))]
    random.Random(0).shuffle(files)
    SHARDS.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(files) // NUM_SHARDS)
    for s in range(NUM_SHARDS):
        with wds.TarWriter(str(SHARDS / f"train-{s:06d}.tar")) as sink:
            for i, (f, label) in enumerate(files[s * per_shard : (s + 1) * per_shard]):
                sink.write({"__key__": f"{s:06d}_{i:06d}", "jpg": f.read_bytes(), "cls": label})
    (SHARDS / ".complete").touch()


def make_parquet() -> None:
    """The photos as a Hugging Face image dataset's Parquet files, as earlier releases of
    `datasets` wrote them (pyarrow, row groups of 100 for images, its Image feature in the
    schema's metadata), in a fixed shuffled order; kept across runs."""
    if (PARQUET / ".complete").exists():
        return
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    classes = sorted(d.name for d in IMAGES.iterdir() if d.is_dir())
    files = [(f, label) for label, c in enumerate(classes) for f in sorted((IMAGES / c).glob("*.JPEG"))]
    random.Random(0).shuffle(files)
    features = {"image": {"_type": "Image"}, "label": {"dtype": "int64", "_type": "Value"}}
    schema = pa.schema(
        [("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])), ("label", pa.int64())],
        metadata={"huggingface": json.dumps({"info": {"features": features}})},
    )
    PARQUET.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(files) // PARQUET_FILES)
    for k in range(PARQUET_FILES):
        part = files[k * per_file : (k + 1) * per_file]
        table = pa.table(
            {
                "image": [{"bytes": f.read_bytes(), "path": f.name} for f, _ in part],
                "label": [label for _, label in part],
            },
            schema=schema,
        )
        pq.write_table(table, PARQUET / f"train-{k:05d}-of-{PARQUET_FILES:05d}.parquet", row_group_size=100)
    (PARQUET / ".complete").touch()


def make_npy() -> None:
    """The npy workload's arrays (random pixels, labels 0..999); kept across runs."""
    import numpy as np

    if NPY.exists() and NPY_LABELS.exists():
        return
    NPY.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    data = np.lib.format.open_memmap(NPY, mode="w+", dtype=np.uint8, shape=NPY_SHAPE)
    for i in range(0, NPY_SHAPE[0], 256):
        data[i : i + 256] = rng.integers(0, 256, (min(256, NPY_SHAPE[0] - i), *NPY_SHAPE[1:]), np.uint8)
    data.flush()
    del data
    np.save(NPY_LABELS, rng.integers(0, 1000, NPY_SHAPE[0]).astype(np.int64))


def memcpy_samples_per_s() -> float:
    """One thread copying npy batches: the bandwidth a gather of samples is bounded by."""
    import numpy as np

    src = np.load(NPY, mmap_mode="r")[:NPY_BATCH]
    src = np.ascontiguousarray(src)  # in memory, as the page cache holds the file
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(10):
            np.copyto(dst, src)
        best = min(best, (time.perf_counter() - t) / 10)
    return NPY_BATCH / best


def decode_file(path: str) -> int:
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("RGB").size[0]


def decode_only_images_per_s() -> float:
    """Pillow (libjpeg-turbo) decoding every file on 2 processes: what decoding alone costs."""
    from multiprocessing import Pool

    files = sorted(str(p) for p in IMAGES.rglob("*.JPEG"))
    with Pool(WORKERS) as pool:
        pool.map(decode_file, files, chunksize=16)  # warm-up
        t = time.perf_counter()
        for _ in range(2):
            pool.map(decode_file, files, chunksize=16)
        return 2 * len(files) / (time.perf_counter() - t)


def fastest_decoder_images_per_s() -> tuple[str, float]:
    """`stoker bench decoders`: zune-jpeg, libjpeg-turbo and Pillow decoding whole images from
    memory on WORKERS threads (processes for Pillow); the fastest, by name."""
    cli = os.environ.get("STOKER_CLI", str(HERE.parent / "target" / "release" / "stoker"))
    cmd = [cli, "bench", "decoders", str(IMAGES), "--rounds", "1", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, PYTHON=sys.executable), check=True)
    report = json.loads(out.stdout)
    column = report["threads"].index(WORKERS)
    rates = {
        row["decoder"]: row["images_per_s"][column]
        for row in report["decoders"]
        if "whole image" in row["decoder"] and row["images_per_s"][column]
    }
    name = max(rates, key=rates.get)
    return name, rates[name]


def run_child(workload: str, name: str, script: str = __file__, timeout: int = 300) -> dict:
    """Runs loader `name` on `workload` in a child process of `script` (`--child`)."""
    cmd = [sys.executable, script, "--child", workload, name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def best(a: dict | None, b: dict) -> dict:
    """Per metric, the better of two rounds: other jobs on a shared machine only ever slow a
    loader down or inflate its memory, so the best round is the closest to its own cost."""
    if a is None or "error" in a:
        return b
    if "error" in b:
        return a
    return dict(
        a,
        samples_per_s=max(a["samples_per_s"], b["samples_per_s"]),
        first_batch_s=min(a["first_batch_s"], b["first_batch_s"]),
        peak_rss=min(a["peak_rss"], b["peak_rss"]),
        peak_pss=min(a["peak_pss"], b["peak_pss"]),
    )


def table(results: dict, limits: dict, baseline: dict) -> str:
    mib = 1024 * 1024
    head = (
        f"{'workload':<8} {'loader':<30} {'samples/s':>10} {'first batch':>12} {'peak RSS':>10}"
        f" {'peak PSS':>10}   stoker: speed  first batch   RSS   PSS"
    )
    lines = [head, "-" * len(head)]
    for workload in dict.fromkeys(w for w, _ in results):
        ours = results[(workload, "stoker")]
        for (w, name), r in results.items():
            if w != workload:
                continue
            if "error" in r:
                lines.append(f"{workload:<8} {name:<30} failed: {r['error']}")
                continue
            ratio = ""
            if name != "stoker" and "error" not in ours:
                ratio = (
                    f"   {ours['samples_per_s'] / r['samples_per_s']:>12.2f}x"
                    f" {ours['first_batch_s'] / r['first_batch_s']:>12.2f}"
                    f" {ours['peak_rss'] / r['peak_rss']:>5.2f} {ours['peak_pss'] / r['peak_pss']:>5.2f}"
                )
            lines.append(
                f"{workload:<8} {name:<30} {r['samples_per_s']:>10.0f}"
                f" {r['first_batch_s'] * 1000:>9.0f} ms {r['peak_rss'] / mib:>6.0f} MiB"
                f" {r['peak_pss'] / mib:>6.0f} MiB{ratio}"
            )
        for name, value in limits[workload]:
            ratio = f"   stoker = {ours['samples_per_s'] / value:.2f}x it" if "error" not in ours else ""
            lines.append(f"{workload:<8} {'limit: ' + name:<30} {value:>10.0f}{ratio}")
        if "peak_rss" in baseline and "error" not in ours:
            # What each loader adds to a process that imported torch: the loader's own memory.
            base = baseline["peak_rss"]
            own = (ours["peak_rss"] - base) / mib
            peers = [
                f"{n} {(r['peak_rss'] - base) / mib:.0f} MiB ({own / max((r['peak_rss'] - base) / mib, 1):.2f})"
                for (w, n), r in results.items()
                if w == workload and n != "stoker" and "error" not in r
            ]
            lines.append(f"{workload:<8} * RSS above the torch-import baseline: stoker {own:.0f} MiB; " + ", ".join(peers))
        py = results.get((workload, PY_DATASET))
        if py and "error" not in py:
            # The Python-dataset row's own ratios: against the built-in source and the peers.
            builtin = {"images": "image_folder", "npy": "npy"}[workload]
            own = (
                f"{py['samples_per_s'] / ours['samples_per_s']:.2f} of stoker ({builtin})'s samples/s"
                if "error" not in ours
                else f"stoker ({builtin}) failed"
            )
            peers = [
                f"{py['samples_per_s'] / r['samples_per_s']:.2f}x {n}"
                for (w, n), r in results.items()
                if w == workload and n not in ("stoker", PY_DATASET) and "error" not in r
            ]
            lines.append(f"{workload:<8} * {PY_DATASET} = {own}; speed: " + (", ".join(peers) or "no peer"))
    return "\n".join(lines)


def main() -> None:
    if "--packed" in sys.argv[1:]:
        # stoker's packed format against FFCV 1.0.2 has its own script; the other options go to it.
        rest = [a for a in sys.argv[1:] if a != "--packed"]
        os.execv(sys.executable, [sys.executable, str(HERE / "compare_packed.py"), *rest])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "LOADER"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--workloads",
        default="images,npy,tar",
        help="comma-separated subset of images, npy, tar, parquet (needs pyarrow and datasets)",
    )
    parser.add_argument("--augment", action="store_true", help="only the augmentation recipe")
    parser.add_argument(
        "--porting",
        action="store_true",
        help="only torchvision's ImageFolder: torch DataLoader against stoker.torch.DataLoader",
    )
    parser.add_argument(
        "--packed",
        action="store_true",
        help="only stoker's packed format against FFCV 1.0.2 (bench/compare_packed.py; its "
        "--images N and --rounds R follow)",
    )
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if not (IMAGES / ".complete").exists():
        raise SystemExit(f"{IMAGES} is missing: run bash bench/run.sh, which builds it")
    if args.augment:
        augment_comparison()
        return
    if args.porting:
        porting_comparison()
        return
    workloads = [w for w in args.workloads.split(",") if w]
    runs = [(w, n) for w, n in RUNS if w in workloads]
    make_npy()
    if "tar" in workloads:
        make_shards()
    if "parquet" in workloads:
        make_parquet()
    print(f"{os.cpu_count()} cores; images: {sum(1 for _ in IMAGES.rglob('*.JPEG'))} JPEGs in {IMAGES}; "
          f"npy: {NPY_SHAPE} uint8", flush=True)
    results = {}
    baseline = run_child("-", BASELINE)
    memcpy = decode_only = 0.0
    fastest = ("", 0.0)
    for round_ in range(ROUNDS):
        for workload, name in runs:
            print(f"round {round_ + 1}/{ROUNDS}: {workload}: {name} ...", flush=True)
            results[(workload, name)] = best(results.get((workload, name)), run_child(workload, name))
        memcpy = max(memcpy, memcpy_samples_per_s())
        decode_only = max(decode_only, decode_only_images_per_s())
        if {"images", "tar", "parquet"} & set(workloads):
            fastest = max(fastest, fastest_decoder_images_per_s(), key=lambda f: f[1])
    decode_limits = [("decode only, Pillow, 2 procs", decode_only)]
    if fastest[1]:
        # The fastest whole-image decoder, decoding from memory (no file reads), 2 threads.
        short = fastest[0].replace(", whole image", "").replace(" (libjpeg-turbo)", "")
        decode_limits.append((f"decode only, {short}, 2 thr", fastest[1]))
    limits = {
        "npy": [("memcpy, 1 thread", memcpy)],
        "images": decode_limits,
        "tar": decode_limits,
        "parquet": decode_limits,
    }
    print()
    print(table(results, limits, baseline))
    if "peak_rss" in baseline:
        print(
            f"baseline: a Python process that imported torch alone has "
            f"{baseline['peak_rss'] / 2**20:.0f} MiB RSS, {baseline['peak_pss'] / 2**20:.0f} MiB PSS"
        )
    out = DATA / "results.json"
    out.write_text(json.dumps({f"{w}/{n}": r for (w, n), r in results.items()}, indent=1))


def augment_comparison() -> None:
    """The timm-like recipe, stoker vs torchvision v2 in torch DataLoader, one run."""
    peer = "torchvision decode_jpeg + v2"
    print(f"{os.cpu_count()} cores; {sum(1 for _ in IMAGES.rglob('*.JPEG'))} JPEGs in {IMAGES}; "
          f"stoker transform: {AUG_SPEC}; {WORKERS} workers each", flush=True)
    results: dict = {}
    for round_ in range(ROUNDS):
        for name in ("stoker", peer):
            print(f"round {round_ + 1}/{ROUNDS}: augment: {name} ...", flush=True)
            results[name] = best(results.get(name), run_child("augment", name))
    print()
    for name, r in results.items():
        if "error" in r:
            print(f"augment  {name:<30} failed: {r['error']}")
        else:
            print(f"augment  {name:<30} {r['samples_per_s']:>8.0f} samples/s  first batch "
                  f"{r['first_batch_s'] * 1000:.0f} ms  peak RSS {r['peak_rss'] / 2**20:.0f} MiB")
    ours, theirs = results["stoker"], results[peer]
    if "error" not in ours and "error" not in theirs:
        print(f"augment  stoker speed = {ours['samples_per_s'] / theirs['samples_per_s']:.2f}x {peer}")


def porting_comparison() -> None:
    """torchvision's ImageFolder: torch DataLoader against the same object in stoker.torch."""
    print(f"{os.cpu_count()} cores; {sum(1 for _ in IMAGES.rglob('*.JPEG'))} JPEGs in {IMAGES}; "
          f"transform: {SPEC}; batches of {IMAGE_BATCH}; {WORKERS} workers each", flush=True)
    results: dict = {}
    for round_ in range(ROUNDS):
        for name in PORTING_RUNS:
            print(f"round {round_ + 1}/{ROUNDS}: porting: {name} ...", flush=True)
            results[name] = best(results.get(name), run_child("porting", name))
    print()
    print(f"{'loader':<42} {'samples/s':>10} {'vs torch':>9} {'first batch':>12} {'peak RSS':>9}")
    torch_rate = results[PORTING_TORCH].get("samples_per_s")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<42} failed: {r['error']}")
            continue
        ratio = f"{r['samples_per_s'] / torch_rate:>8.2f}x" if torch_rate else f"{'-':>9}"
        print(f"{name:<42} {r['samples_per_s']:>10.0f} {ratio} {r['first_batch_s'] * 1000:>9.0f} ms"
              f" {r['peak_rss'] / 2**20:>5.0f} MiB")


if __name__ == "__main__":
    main()
