"""Remote shards against local ones, in one run: the same JPEG tar shards read from a local
directory, and over HTTP from nginx on 127.0.0.1 behind a proxy that delays every request by
--latency-ms (a far object store's round trip). For each: readiness (loader construction to the
first batch) and samples/s over a whole epoch including construction; for HTTP, epoch 1 cold
(downloading into an empty cache_dir; at shard_prefetch 2, the default, and --shard-prefetch),
epoch 2 of the same loader (cache, no network), and a new loader on the filled cache (one HEAD
per shard, then local reads); then the same cold epoch from a WebDataset `wids` index of the
shards (tar:URL/train.json), which opens at once and reads each shard while it downloads. Epoch 1 rows include opening the loader and compare with local
tar's epoch 1 (also opened); epoch 2 rows with local tar's epoch 2.

Usage (bench/remote_shards.sh starts nginx): remote_shards.py SHARD_DIR HTTP_PORT"""

import argparse
import asyncio
import io
import json
import os
import shutil
import tarfile
import tempfile
import threading
import time

import numpy as np
from PIL import Image

import stoker


def make_shards(out: str, shards: int, per_shard: int, side: int) -> None:
    rng = np.random.default_rng(0)
    g = 0
    for s in range(shards):
        with tarfile.open(f"{out}/train-{s:04d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
            for _ in range(per_shard):
                # A smooth gradient with noise: compresses like a photograph, not like noise.
                y, x = np.mgrid[0:side, 0:side]
                base = np.stack([x * 255 // side, y * 255 // side, (x + y) * 127 // side], -1)
                pixels = np.clip(base + rng.integers(-24, 24, base.shape), 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, "JPEG", quality=90)
                for ext, data in (("jpg", buf.getvalue()), ("cls", str(g % 1000).encode())):
                    info = tarfile.TarInfo(f"{g:08d}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
                g += 1


def write_wids_index(shard_dir: str) -> None:
    """The shard index `widsindex create` writes: each shard with its sample count."""
    shardlist = []
    for name in sorted(n for n in os.listdir(shard_dir) if n.endswith(".tar")):
        with tarfile.open(f"{shard_dir}/{name}") as t:
            keys = {m.name.rsplit(".", 1)[0] for m in t.getmembers()}
        shardlist.append(
            {"url": name, "nsamples": len(keys), "filesize": os.path.getsize(f"{shard_dir}/{name}")}
        )
    index = {"__kind__": "wids-shard-index-v1", "wids_version": 1, "shardlist": shardlist}
    with open(f"{shard_dir}/train.json", "w") as f:
        json.dump(index, f)


def start_delay_proxy(target_port: int, delay_s: float) -> int:
    """A TCP proxy on 127.0.0.1 that holds every chunk the client sends (a request) for
    delay_s before passing it on; responses pass at once."""
    ready = threading.Event()
    port_box: list[int] = []

    async def pipe(reader, writer, delay):
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def handle(client_r, client_w):
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(client_r, server_w, delay_s), pipe(server_r, client_w, 0))

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_box.append(server.sockets[0].getsockname()[1])
        ready.set()
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    ready.wait(10)
    return port_box[0]


OPTIONS = dict(
    batch_size=64,
    transform="resize(224) | center_crop(224) | normalize(imagenet)",
    num_workers=2,
    shuffle_buffer=1000,
)


def run_epoch(loader: stoker.Loader, t0: float) -> tuple[float, float, int]:
    first = None
    n = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
        n += batch.size
    return first or 0.0, time.perf_counter() - t0, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("shard_dir")
    ap.add_argument("http_port", type=int)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--per-shard", type=int, default=100)
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--latency-ms", type=float, default=50)
    ap.add_argument("--shard-prefetch", type=int, default=16)
    args = ap.parse_args()
    if not os.listdir(args.shard_dir):
        make_shards(args.shard_dir, args.shards, args.per_shard, args.side)
    if not os.path.exists(f"{args.shard_dir}/train.json"):
        write_wids_index(args.shard_dir)
    last = f"{args.shards - 1:04d}"
    proxy = start_delay_proxy(args.http_port, args.latency_ms / 1000)
    local = f"tar:{args.shard_dir}/train-{{0000..{last}}}.tar"
    remote = f"tar:http://127.0.0.1:{proxy}/train-{{0000..{last}}}.tar"
    indexed = f"tar:http://127.0.0.1:{proxy}/train.json"
    caches = [tempfile.mkdtemp(prefix="stoker-remote-bench-") for _ in range(4)]
    rows = []  # (name, first batch s, epoch s, samples, the local row it is compared with)
    try:
        # Warm the page cache and the index files.
        t0 = time.perf_counter()
        with stoker.Loader(local, **OPTIONS) as l:
            run_epoch(l, t0)
        t0 = time.perf_counter()
        with stoker.Loader(local, **OPTIONS) as l:
            rows.append(("local tar, epoch 1 (with opening)", *run_epoch(l, t0), 0))
            l.set_epoch(1)
            t0 = time.perf_counter()
            rows.append(("local tar, epoch 2", *run_epoch(l, t0), 1))

        def cold_then_cached(source: str, name: str, prefetch: int, cache: str) -> None:
            t0 = time.perf_counter()
            with stoker.Loader(source, cache_dir=cache, shard_prefetch=prefetch, **OPTIONS) as l:
                rows.append((f"{name} epoch 1 cold, shard_prefetch={prefetch}", *run_epoch(l, t0), 0))
                l.set_epoch(1)
                t0 = time.perf_counter()
                rows.append((f"{name} epoch 2 (cache), shard_prefetch={prefetch}", *run_epoch(l, t0), 1))

        cold_then_cached(remote, "http", 2, caches[0])
        cold_then_cached(remote, "http", args.shard_prefetch, caches[1])
        t0 = time.perf_counter()
        with stoker.Loader(
            remote, cache_dir=caches[1], shard_prefetch=args.shard_prefetch, **OPTIONS
        ) as l:
            rows.append(("http new loader on the filled cache", *run_epoch(l, t0), 0))
        cold_then_cached(indexed, "http wids index,", 2, caches[2])
        cold_then_cached(indexed, "http wids index,", args.shard_prefetch, caches[3])
    finally:
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)
    print(
        f"{args.shards} shards x {args.per_shard} JPEGs ({args.side}px), "
        f"{args.latency_ms:.0f} ms added per request, {OPTIONS['num_workers']} workers, "
        f"shuffle_buffer={OPTIONS['shuffle_buffer']}"
    )
    print(f"{'read':52} {'first batch':>12} {'epoch s':>8} {'samples/s':>10} {'vs local':>9}")
    for name, first, total, n, against in rows:
        rate = n / total
        base = rows[against][3] / rows[against][2]
        print(f"{name:52} {first * 1000:9.1f} ms {total:8.2f} {rate:10.0f} {rate / base:8.2f}x")

if __name__ == "__main__":
    main()
