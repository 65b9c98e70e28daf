#!/usr/bin/env python3
"""The GPU trainer benchmark: how many images per second a real training step gets from each
input pipeline, and how much of the step the GPU spends waiting for data.

    python bench/gpu_trainer.py [ROOT] [--models resnet18,resnet50] [--steps 60] [--workers N]

ROOT is an ImageFolder of JPEGs (default bench/.data/imagenet_like, made by bench/run.sh). For
each model (torchvision ResNet-18 and ResNet-50, random weights, SGD, bf16 autocast,
channels_last, batch 256, 224 px) it runs, one after the other in one process:

  ceiling            the same steps on one synthetic batch already on the GPU: the model's own
                     speed, which no loader can beat
  stoker cuda        stoker.torch.DataLoader(..., device="cuda"): batches copied by stoker's
                     prefetcher on its own stream as uint8, normalised into float32 there by
                     the cast kernel (gpu_normalize, the default)
  stoker cuda f32    the same with gpu_normalize=False: float32 made on the CPU and copied
  stoker gpu decode  jpeg_decoder="gpu": the prefetch thread decodes the JPEGs with nvJPEG and
                     crops/resizes/flips them on the device (the workers only read and plan)
  stoker auto        jpeg_decoder="auto" with autotune: the share decoded on the device moves
                     with the cores' load (stats gpu_decode_share, printed after the row)
  torchvision nvJPEG the DALI-like peer in the torch wheel: files read by a thread pool,
                     torchvision.io.decode_jpeg(list, device="cuda") batched, then v2
                     RandomResizedCrop/RandomHorizontalFlip/Normalize per image on the GPU
  stoker cpu+pinned  device="cpu", pin_memory=True, then `.cuda(non_blocking=True)` in the
                     step: the porting path of torch code
  torch DataLoader   torchvision ImageFolder + PIL + RandomResizedCrop/RandomHorizontalFlip/
                     ToTensor/Normalize, N worker processes, pin_memory, prefetch_factor 4

and prints images/s, the share of step time spent waiting for the next batch, the GPU's busy
share (NVML utilisation, sampled every 50 ms while the timed steps run) and the ratio to the
ceiling. Every pipeline uses the same transform: random_resized_crop(224) | hflip |
normalize(imagenet), float32.

Without a CUDA GPU it says so and exits 0: there is nothing to measure. `--cpu-smoke` runs the
whole script on the CPU with a few tiny steps, to check that it runs (its figures mean nothing).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = "random_resized_crop(224) | hflip | normalize(imagenet)"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class GpuBusy(threading.Thread):
    """Mean NVML utilisation of GPU `index` between start() and stop(): the share of time a
    kernel was running. NVML comes with the driver (libnvidia-ml.so.1), loaded with ctypes so
    that no Python package is needed."""

    class Rates(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    def __init__(self, index: int):
        super().__init__(daemon=True)
        self.samples: list[int] = []
        self.done = threading.Event()
        try:
            self.nvml = ctypes.CDLL("libnvidia-ml.so.1")
            self.device = ctypes.c_void_p()
            ok = self.nvml.nvmlInit_v2() == 0
            ok = ok and self.nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.device)) == 0
        except OSError:
            ok = False
        self.available = ok

    def run(self) -> None:
        rates = self.Rates()
        while not self.done.wait(0.05):
            if self.nvml.nvmlDeviceGetUtilizationRates(self.device, ctypes.byref(rates)) == 0:
                self.samples.append(rates.gpu)

    def stop(self) -> float | None:
        self.done.set()
        self.join()
        return sum(self.samples) / len(self.samples) / 100 if self.samples else None


def make_model(name: str, device, smoke: bool):
    import torch
    import torchvision

    model = getattr(torchvision.models, name)(weights=None, num_classes=1000)
    model = model.to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    autocast_device = "cpu" if smoke else "cuda"

    def step(images, labels):
        images = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast(autocast_device, dtype=torch.bfloat16):
            loss = loss_fn(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run_pipeline(step, batches, device, steps: int, warmup: int, busy_index: int | None):
    """Runs `warmup` then `steps` training steps on `batches` (an iterator of (images, labels)
    on any device); returns (images/s, share of the timed steps spent in next(), GPU busy)."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    it = iter(batches)
    for _ in range(warmup):
        images, labels = next(it)
        step(images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
    sync()
    busy = GpuBusy(busy_index) if busy_index is not None else None
    if busy is not None and busy.available:
        busy.start()
    waited, seen = 0.0, 0
    start = time.perf_counter()
    for _ in range(steps):
        before = time.perf_counter()
        images, labels = next(it)
        waited += time.perf_counter() - before
        step(images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
        seen += len(labels)
    sync()
    elapsed = time.perf_counter() - start
    share = busy.stop() if busy is not None and busy.available else None
    return seen / elapsed, waited / elapsed, share


def forever(make_epoch):
    """Batches of epoch after epoch, as a trainer iterates."""
    while True:
        yield from make_epoch()


def pipelines(root: Path, batch: int, workers: int, device, smoke: bool):
    """(name, factory) for every pipeline measured: the factory builds the loader and returns
    its endless batch iterator, so that only the loader being measured has threads or
    processes running (each is freed with its iterator)."""
    import torch
    import torchvision
    from torchvision import transforms

    import stoker.torch as stoker_torch

    def synthetic():
        images = torch.randn(batch, 3, 224, 224, device=device)
        labels = torch.randint(0, 1000, (batch,), device=device)
        while True:
            yield images, labels

    made = {}

    def decode_stats():
        """How the last stoker loader decoded: the share on the device and images decoded there."""
        loader = made.get("stoker")
        if loader is None:
            return None
        s = loader.stats()
        return f"gpu_decode_share {s.gpu_decode_share:.1f}, {s.decoded_device:,} images decoded on the GPU"

    def stoker_loader(**options):
        def make():
            loader = stoker_torch.DataLoader(
                f"image_folder:{root}",
                batch_size=batch,
                shuffle=True,
                drop_last=True,
                num_workers=workers,
                transform=SPEC,
                **options,
            )
            made["stoker"] = loader
            return forever(lambda: iter(loader))

        return make

    def torch_loader():
        tf = transforms.Compose(
            [
                transforms.RandomResizedCrop(224),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(MEAN, STD),
            ]
        )
        dataset = torchvision.datasets.ImageFolder(str(root), transform=tf)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=batch,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            pin_memory=not smoke,
            prefetch_factor=4,
            persistent_workers=True,
        )
        return forever(lambda: iter(loader))

    def torchvision_nvjpeg():
        from concurrent.futures import ThreadPoolExecutor

        from torchvision.io import decode_jpeg
        from torchvision.transforms import v2

        dataset = torchvision.datasets.ImageFolder(str(root))
        tf = v2.Compose(
            [
                v2.RandomResizedCrop(224, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(MEAN, STD),
            ]
        )
        pool = ThreadPoolExecutor(workers)

        def read(path):
            return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8)

        def epoch():
            order = torch.randperm(len(dataset.samples)).tolist()
            for start in range(0, len(order) - batch + 1, batch):
                picked = [dataset.samples[i] for i in order[start : start + batch]]
                data = list(pool.map(read, [p for p, _ in picked]))
                images = decode_jpeg(data, device=device)
                images = torch.stack([tf(image) for image in images])
                labels = torch.tensor([label for _, label in picked])
                yield images, labels

        return forever(epoch)

    yield "ceiling (synthetic batch)", synthetic
    if not smoke:
        yield "stoker cuda (uint8 across, gpu_normalize)", stoker_loader(device="cuda")
        yield "stoker cuda (float32 across)", stoker_loader(device="cuda", gpu_normalize=False)
        yield "stoker cuda, jpeg_decoder=gpu (nvJPEG)", stoker_loader(device="cuda", jpeg_decoder="gpu"), decode_stats
        yield "stoker cuda, jpeg_decoder=auto + autotune", stoker_loader(device="cuda", autotune=True), decode_stats
        yield "torchvision decode_jpeg(cuda) + v2 on GPU", torchvision_nvjpeg
    yield "stoker cpu+pinned, .cuda(non_blocking)", stoker_loader(pin_memory=not smoke)
    yield f"torch DataLoader + PIL ({workers} workers)", torch_loader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", type=Path, default=HERE / ".data" / "imagenet_like")
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per pipeline")
    parser.add_argument("--warmup", type=int, default=15, help="steps before timing")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run on the CPU: checks the script, measures nothing")
    args = parser.parse_args()

    import torch

    smoke = args.cpu_smoke
    if not smoke and not torch.cuda.is_available():
        print("gpu_trainer: SKIPPED: no CUDA GPU (torch.cuda.is_available() is False); nothing to measure")
        return 0
    if not args.root.is_dir():
        print(f"gpu_trainer: {args.root} is not a folder of images; bench/run.sh makes bench/.data/imagenet_like")
        return 1
    if smoke:
        args.batch, args.steps, args.warmup, args.models = 4, 2, 1, "resnet18"
    device = torch.device("cpu" if smoke else "cuda")
    if not smoke:
        torch.backends.cudnn.benchmark = True
        print(f"GPU: {torch.cuda.get_device_name(0)}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}")
    print(f"data: {args.root}, batch {args.batch}, {args.workers} workers, {args.steps} timed steps after {args.warmup}")

    for name in args.models.split(","):
        step = make_model(name, device, smoke)
        print(f"\n{name} (bf16 autocast, channels_last)")
        print(f"{'pipeline':<44} {'img/s':>8} {'waiting':>8} {'GPU busy':>9} {'of ceiling':>11}")
        ceiling = None
        for label, batches, *after in pipelines(args.root, args.batch, args.workers, device, smoke):
            rate, waiting, busy = run_pipeline(
                step, batches(), device, args.steps, args.warmup, None if smoke else 0
            )
            ceiling = ceiling or rate
            busy_text = f"{busy:.0%}" if busy is not None else "n/a"
            print(f"{label:<44} {rate:8,.0f} {waiting:8.0%} {busy_text:>9} {rate / ceiling:11.2f}")
            note = after[0]() if after else None
            if note:
                print(f"{'':<44} ({note})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
