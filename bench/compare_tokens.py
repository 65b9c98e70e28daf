#!/usr/bin/env python3
"""stoker's token stream side by side with nanoGPT's get_batch, in one run, on the same file.

    python bench/compare_tokens.py                 # 200 M uint16 tokens, made once
    python bench/compare_tokens.py --batches 100   # a quick check

Where LitData is installed, its token pipeline joins them (`--litdata`, on by default): the same
tokens written once by `litdata.optimize` for its `TokensLoader` (int32 chunks, as lit-gpt
prepares them), read as lit-gpt trains: `StreamingDataset(TokensLoader(block_size=--block + 1),
shuffle=True)` through `StreamingDataLoader(pin_memory=True)` with the same worker counts, each
block cut into inputs and labels and widened to int64. Its windows do not share a token (blocks
of `--block + 1`), so it reads 1/--block more bytes per input token than the others.

Where pyarrow and tokenizers are installed, a table of `parquet:` (`--parquet-rows`, 0 leaves it
out): generated text in Parquet files (snappy, row groups of 1,000 rows) and a byte-level BPE
trained on it, read by stoker's `parquet:` in order and shuffled, beside the tokenize-and-pack
stream of Hugging Face recipes (pyarrow row groups, `Tokenizer.encode_batch`, a running buffer
cut into windows, in a torch DataLoader's worker processes), each with one worker and every
core.

Then, where megatron-core is installed and `stoker bench tokens` has written its 2,500 Megatron
datasets, the time to open them all: stoker's loader beside megatron-core's `IndexedDataset`
per prefix (what its `GPTDataset` opens before building its own sample index), files evicted
from the page cache and then cached; and megatron-core's `GPTDataset` itself over the same
datasets (`--gpt-dataset`, on by default), one run: its build (document, sample and shuffle
indices written to a fresh `path_to_cache`, then built again from that cache) beside stoker's
first open (its index cache written) and a later one (loaded), and random samples of
`seq_len=2048` read one at a time from the built dataset beside stoker's loader
(`num_workers=1`, `shuffle=True`), with the ratios.

The file is nanoGPT's format: every document's uint16 tokens one after the other (`train.bin`),
written once into the cache directory. Both read windows of `--block + 1` tokens at random
places and deliver int64 `x` (inputs) and `y` (the inputs shifted by one), `--batch` rows a
batch, as torch tensors:
  nanoGPT  `get_batch` exactly as nanoGPT's train.py writes it: a new np.memmap per batch (its
           workaround for a memory leak), torch.randint offsets, per-row `astype(np.int64)` and
           torch.stack, then `pin_memory()` where CUDA is present (as train.py does before its
           non_blocking copy); one Python thread, as in nanoGPT
  stoker   stoker.Loader("tokens:train.bin", token_dtype="uint16", seq_len=--block, shuffle=True,
           pin_memory=True) with num_workers 1 and every usable core, `batch.torch()` (DLPack,
           no copy)

What differs, honestly: nanoGPT draws offsets anywhere (windows overlap, an epoch means
nothing); stoker shuffles the non-overlapping windows `i * block` of an epoch. Both copy the same
number of bytes per token. Measured per row: input tokens/s over `--batches` batches after as
many to warm up, and tokens per CPU-second of the process and its live children (all their
threads, from /proc), the cost a trainer's host pays, worker processes included; every row runs
`--rounds` times, interleaved, keeping its best.
"""

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch

import stoker


def nanogpt(path: Path, block: int, batch: int):
    """nanoGPT's get_batch (train.py), for the CPU or with pinned memory under CUDA."""

    def get_batch():
        data = np.memmap(path, dtype=np.uint16, mode="r")
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([torch.from_numpy((data[i : i + block]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + block]).astype(np.int64)) for i in ix])
        if torch.cuda.is_available():
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    while True:
        yield get_batch()


def stoker_batches(path: Path, block: int, batch: int, workers: int):
    loader = stoker.Loader(
        f"tokens:{path}",
        token_dtype="uint16",
        seq_len=block,
        batch_size=batch,
        shuffle=True,
        pin_memory=True,
        num_workers=workers,
    )
    while True:
        for b in loader:
            t = b.torch()
            yield t["input_ids"], t["labels"]


def litdata_chunks(path: Path, block: int) -> Path | None:
    """The same tokens as LitData's `optimize` writes them for its `TokensLoader` (int32 chunks,
    as lit-gpt and TinyLlama prepare theirs), once, beside the file; None without litdata."""
    try:
        import litdata
    except ImportError:
        print("\nLitData is not installed (pip install litdata): its rows are left out")
        return None
    out = path.with_name(path.stem + f"-litdata-{block + 1}")
    if not (out / "index.json").exists():
        data = np.memmap(path, dtype=np.uint16, mode="r")
        pieces = 64
        step = -(-len(data) // pieces)
        print(f"writing LitData chunks of {path.name} into {out} ...")
        litdata.optimize(
            fn=_litdata_piece,
            inputs=[(str(path), i * step, min(len(data), (i + 1) * step)) for i in range(pieces)],
            output_dir=str(out),
            chunk_size=(block + 1) * 1024,
            item_loader=litdata.TokensLoader(),
            num_workers=len(os.sched_getaffinity(0)),
        )
    return out


def _litdata_piece(piece):
    """One piece of the file as one LitData item (a module function: optimize pickles it)."""
    name, start, end = piece
    data = np.memmap(name, dtype=np.uint16, mode="r")
    yield torch.from_numpy(data[start:end].astype(np.int32))


def litdata_batches(chunks: Path, block: int, batch: int, workers: int):
    """LitData's token pipeline as lit-gpt trains with it: StreamingDataset of TokensLoader
    blocks of `block + 1`, shuffled, through StreamingDataLoader with pinned memory; inputs and
    labels cut from each block and widened to int64 as the others deliver them."""
    import litdata

    dataset = litdata.StreamingDataset(
        input_dir=str(chunks),
        item_loader=litdata.TokensLoader(block_size=block + 1),
        shuffle=True,
        drop_last=True,
    )
    loader = litdata.StreamingDataLoader(
        dataset, batch_size=batch, pin_memory=True, num_workers=workers, drop_last=True
    )
    while True:
        for b in loader:
            yield b[:, :-1].long(), b[:, 1:].long()


def cpu_seconds() -> float:
    """CPU time of this process (all threads, to the nanosecond) and of its live descendants
    (LitData's workers are processes; /proc counts them in clock ticks)."""
    ticks, stack = 0, []
    for task in os.listdir("/proc/self/task"):
        stack += map(int, Path(f"/proc/self/task/{task}/children").read_text().split())
    while stack:
        pid = stack.pop()
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
            for task in os.listdir(f"/proc/{pid}/task"):
                stack += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            pass  # ended meanwhile
    return time.process_time() + ticks / os.sysconf("SC_CLK_TCK")


def measure(batches, n: int) -> tuple[float, float]:
    """Input tokens per second and per CPU-second over `n` batches, after `n` to warm up."""
    for _ in range(n):
        next(batches)
    tokens = 0
    wall, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(n):
        x, y = next(batches)
        tokens += x.numel()
    wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
    return tokens / wall, tokens / max(cpu, 1e-9)


def evict(paths) -> None:
    """Drops the files' pages from the page cache (as on a fresh node)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def startup(directory: Path, rounds: int) -> None:
    """Opening the Megatron datasets `stoker bench tokens` wrote: stoker's loader (every index
    mapped and checked) beside megatron-core's `IndexedDataset` for each prefix, files evicted
    from the page cache and then cached, interleaved rounds, best of each."""
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError:
        print("\nstartup: megatron-core is not installed (pip install megatron-core), left out")
        return
    prefixes = sorted(str(p)[: -len(".idx")] for p in directory.glob("part-*.idx"))
    if not prefixes:
        print(f"\nstartup: no datasets in {directory}: run `stoker bench tokens` first, left out")
        return
    files = [p + ext for p in prefixes for ext in (".idx", ".bin")]
    pattern = f"{directory}/part-{{00000..{len(prefixes) - 1:05}}}"
    opens = {
        "stoker.Loader": lambda: stoker.Loader(f"megatron:{pattern}", seq_len=2048).close(),
        "megatron-core IndexedDataset": lambda: [IndexedDataset(p) for p in prefixes],
    }
    best: dict[tuple[str, str], float] = {}
    for _ in range(rounds):
        for name, open_all in opens.items():
            for cache in ("not cached", "cached"):
                if cache == "not cached":
                    evict(files)
                start = time.perf_counter()
                open_all()
                took = time.perf_counter() - start
                best[name, cache] = min(best.get((name, cache), took), took)
    print(f"\nopening {len(prefixes)} Megatron datasets ({directory}), best of {rounds} rounds")
    print(f"{'':32} {'not cached':>12} {'cached':>10}")
    for name in opens:
        print(f"{name:32} {best[name, 'not cached']:11.2f}s {best[name, 'cached']:9.2f}s")


def parquet_text(cache: Path, rows: int) -> tuple[Path, Path] | None:
    """Parquet files of generated English-like text (pyarrow, snappy, row groups of 1,000 rows)
    and a byte-level BPE of 8,000 tokens trained on it (tokenizers), made once."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
        import tokenizers
    except ImportError:
        print("\nparquet: pyarrow and tokenizers are not both installed, left out")
        return None
    root = cache / f"bench-parquet-text-{rows}"
    tokenizer = root / "tokenizer.json"
    if not tokenizer.exists():
        print(f"writing {rows} rows of text into {root} ...")
        root.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
        weights = 1.0 / np.arange(1, 27)
        words = ["".join(rng.choice(letters, rng.integers(1, 10), p=weights / weights.sum()))
                 for _ in range(20_000)]
        zipf = 1.0 / np.arange(1, len(words) + 1)
        zipf /= zipf.sum()
        files = 8
        for f in range(files):
            texts = []
            for _ in range(rows // files):
                picked = rng.choice(len(words), rng.integers(40, 600), p=zipf)
                texts.append(" ".join(words[i] for i in picked) + ".")
            pq.write_table(pa.table({"text": texts}), root / f"train-{f}.parquet",
                           row_group_size=1000, compression="snappy")
        tok = tokenizers.Tokenizer(tokenizers.models.BPE())
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = tokenizers.trainers.BpeTrainer(
            vocab_size=8000, special_tokens=["<|endoftext|>"],
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer)
        tok.save(str(tokenizer))
    return root, tokenizer


class _HuggingFaceStyle(torch.utils.data.IterableDataset):
    """Tokenize-and-pack as Hugging Face streaming recipes (torchtitan's, nanotron's) do it: each
    DataLoader worker reads its share of the row groups with pyarrow, tokenizes a row group's
    texts with `Tokenizer.encode_batch`, appends EOS, and cuts the running buffer into windows."""

    def __init__(self, root: Path, tokenizer: Path, block: int, eos: int):
        self.files = sorted(root.glob("train-*.parquet"))
        self.tokenizer, self.block, self.eos = str(tokenizer), block, eos

    def __iter__(self):
        import pyarrow.parquet as pq
        import tokenizers

        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        tok = tokenizers.Tokenizer.from_file(self.tokenizer)
        groups = [(f, g) for f in self.files for g in range(pq.ParquetFile(f).num_row_groups)]
        buffer: list[int] = []
        while True:
            for f, g in groups[worker::workers]:
                texts = pq.ParquetFile(f).read_row_group(g, columns=["text"]).column(0).to_pylist()
                for encoding in tok.encode_batch(texts):
                    buffer.extend(encoding.ids)
                    buffer.append(self.eos)
                while len(buffer) >= self.block + 1:
                    window = torch.tensor(buffer[: self.block + 1])
                    del buffer[: self.block]
                    yield window[:-1], window[1:]


def parquet_rows(root: Path, tokenizer: Path, block: int, batch: int, cores: int) -> dict:
    """The rows of the Parquet table: stoker's `parquet:` in order and shuffled, and the Hugging
    Face-style stream, each with one worker and every core."""
    eos = 0
    spec = f"parquet:{root}/train-*.parquet"
    start = time.perf_counter()
    stoker.Loader(spec, tokenizer=str(tokenizer), eos_token=eos, seq_len=block).close()
    print(f"parquet: first open (every row tokenized and counted): {time.perf_counter() - start:.2f} s")

    def stoker_parquet(workers, shuffle):
        loader = stoker.Loader(spec, tokenizer=str(tokenizer), eos_token=eos, seq_len=block,
                               batch_size=batch, shuffle=shuffle, pin_memory=True,
                               num_workers=workers)
        while True:
            for b in loader:
                t = b.torch()
                yield t["input_ids"], t["labels"]

    def hf_style(workers):
        loader = torch.utils.data.DataLoader(
            _HuggingFaceStyle(root, tokenizer, block, eos), batch_size=batch,
            num_workers=workers, pin_memory=torch.cuda.is_available())
        yield from loader

    rows = {}
    for workers in sorted({1, cores}):
        rows[f"stoker parquet:, in order, {workers}w"] = lambda w=workers: stoker_parquet(w, False)
        rows[f"stoker parquet:, shuffled, {workers}w"] = lambda w=workers: stoker_parquet(w, True)
        rows[f"HF-style stream, {workers}w"] = lambda w=workers: hf_style(w)
    return rows


class _BenchTokenizer:
    """The little of a tokenizer GPTDataset reads: GPT-2's vocabulary size and end of text."""

    vocab_size = 50257
    eod = 50256
    pad = 50256
    unique_identifiers = {"class": "BenchTokenizer", "vocab_size": 50257}


def gpt_dataset(directory: Path, samples: int) -> None:
    """megatron-core's GPTDataset beside stoker over the Megatron datasets of `stoker bench
    tokens`: build or open time, first and later, and random samples per second; one run."""
    import gc
    import resource
    import shutil
    import tempfile

    try:
        import torch.distributed as dist
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    except ImportError:
        print("\nGPTDataset: megatron-core is not installed (pip install megatron-core), left out")
        return
    prefixes = sorted(str(p)[: -len(".idx")] for p in directory.glob("part-*.idx"))
    if not prefixes:
        print(f"\nGPTDataset: no datasets in {directory}: run `stoker bench tokens` first, left out")
        return
    seq_len = 2048
    # GPTDataset keeps several files open per dataset: thousands of datasets need more than the
    # usual soft limit of 1,024 descriptors.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = Path(tempfile.mkdtemp(prefix="stoker-gpt-dataset-"))
    try:
        if not dist.is_initialized():
            dist.init_process_group(
                "gloo", init_method=f"file://{work / 'store'}", rank=0, world_size=1
            )
        config = GPTDatasetConfig(
            random_seed=1,
            sequence_length=seq_len,
            blend=(prefixes, None),
            split="100,0,0",
            tokenizer=_BenchTokenizer(),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
            path_to_cache=str(work / "cache"),
        )
        build = {}
        for when in ("first", "later"):
            start = time.perf_counter()
            train, _, _ = BlendedMegatronDatasetBuilder(
                GPTDataset, [None, None, None], lambda: True, config
            ).build()
            build[when] = time.perf_counter() - start
            if when == "first":
                del train
                gc.collect()
        rng = np.random.default_rng(0)
        picks = rng.integers(0, len(train), samples)
        start = time.perf_counter()
        for i in picks:
            train[int(i)]
        gpt_rate = samples / (time.perf_counter() - start)
        gpt_len = len(train)
        del train
        gc.collect()

        pattern = f"{directory}/part-{{00000..{len(prefixes) - 1:05}}}"
        for p in prefixes:
            Path(p).with_name(f".{Path(p).name}.idx.stkidx").unlink(missing_ok=True)
        opened = {}
        for when in ("first", "later"):
            start = time.perf_counter()
            stoker.Loader(f"megatron:{pattern}", seq_len=seq_len).close()
            opened[when] = time.perf_counter() - start
        loader = stoker.Loader(
            f"megatron:{pattern}", seq_len=seq_len, batch_size=8, shuffle=True, num_workers=1
        )
        batches = iter(loader)
        next(batches)
        n, start = 0, time.perf_counter()
        while n < samples:
            n += next(batches).size
        stoker_rate = n / (time.perf_counter() - start)
        stoker_len = len(loader) * 8
        loader.close()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(work, ignore_errors=True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    print(
        f"\nmegatron-core GPTDataset and stoker over {len(prefixes)} Megatron datasets, seq_len "
        f"{seq_len} ({gpt_len} and {stoker_len} samples), one run"
    )
    print(f"{'':44} {'GPTDataset':>12} {'stoker':>10} {'ratio':>7}")
    for when, what in (("first", "first (indices built)"), ("later", "later (indices loaded)")):
        print(
            f"{'open, ' + what:44} {build[when]:11.2f}s {opened[when]:9.2f}s "
            f"{build[when] / max(opened[when], 1e-9):7.1f}"
        )
    print(
        f"{'random samples/s (stoker: num_workers=1)':44} {gpt_rate:12.0f} {stoker_rate:10.0f} "
        f"{stoker_rate / gpt_rate:7.1f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=200_000_000, help="tokens in the generated file")
    p.add_argument("--block", type=int, default=1024, help="nanoGPT's block_size, stoker's seq_len")
    p.add_argument("--batch", type=int, default=12, help="rows per batch (nanoGPT's default 12)")
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument(
        "--megatron-dir",
        type=Path,
        default=None,
        help="the datasets of `stoker bench tokens` (default: its folder in the cache directory)",
    )
    p.add_argument(
        "--gpt-dataset",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time megatron-core's GPTDataset over the Megatron datasets (one run)",
    )
    p.add_argument("--gpt-samples", type=int, default=2000, help="random samples read from each")
    p.add_argument("--parquet-rows", type=int, default=40_000,
                   help="rows of generated text for the parquet: table (0: leave it out)")
    p.add_argument("--parquet-batches", type=int, default=100)
    p.add_argument(
        "--litdata",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also LitData's StreamingDataset/TokensLoader over the same tokens, where installed",
    )
    args = p.parse_args()

    cache = args.data_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "stoker"
    path = cache / f"bench-tokens-flat-{args.tokens}.bin"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ({args.tokens * 2 / 1e6:.0f} MB) ...")
        rng = np.random.default_rng(0)
        partial = path.with_suffix(".partial")
        with open(partial, "wb") as f:
            for start in range(0, args.tokens, 1 << 24):
                n = min(1 << 24, args.tokens - start)
                rng.integers(0, 50257, size=n, dtype=np.uint16).tofile(f)
        partial.rename(path)

    cores = len(os.sched_getaffinity(0))
    rows = {"nanoGPT get_batch, 1 thread": lambda: nanogpt(path, args.block, args.batch)}
    for workers in sorted({1, cores}):
        rows[f"stoker, num_workers={workers}"] = (
            lambda w=workers: stoker_batches(path, args.block, args.batch, w)
        )
    chunks = litdata_chunks(path, args.block) if args.litdata else None
    if chunks is not None:
        for workers in sorted({1, cores}):
            rows[f"LitData, num_workers={workers}"] = (
                lambda w=workers: litdata_batches(chunks, args.block, args.batch, w)
            )
    best: dict[str, tuple[float, float]] = {}
    for _ in range(args.rounds):
        for name, make in rows.items():
            rate, per_cpu = measure(make(), args.batches)
            old = best.get(name, (0.0, 0.0))
            best[name] = (max(old[0], rate), max(old[1], per_cpu))

    base_rate, base_cpu = best["nanoGPT get_batch, 1 thread"]
    print(
        f"\n{args.tokens / 1e6:.0f} M uint16 tokens, windows of {args.block + 1}, batches of "
        f"{args.batch}, {cores} cores, best of {args.rounds} rounds"
    )
    print(f"{'':32} {'tokens/s':>12} {'ratio':>7} {'tokens/CPU-s':>14} {'ratio':>7}")
    for name, (rate, per_cpu) in best.items():
        print(f"{name:32} {rate:12.0f} {rate / base_rate:7.2f} {per_cpu:14.0f} {per_cpu / base_cpu:7.2f}")

    text = parquet_text(cache, args.parquet_rows) if args.parquet_rows else None
    if text is not None:
        rows = parquet_rows(*text, args.block, args.batch, cores)
        best = {}
        for _ in range(args.rounds):
            for name, make in rows.items():
                rate, per_cpu = measure(make(), args.parquet_batches)
                old = best.get(name, (0.0, 0.0))
                best[name] = (max(old[0], rate), max(old[1], per_cpu))
        base_rate, base_cpu = best[f"HF-style stream, {cores}w"]
        print(
            f"\nparquet: {args.parquet_rows} rows of text, a BPE of 8,000 tokens, windows of "
            f"{args.block + 1}, batches of {args.batch}, best of {args.rounds} rounds"
        )
        print(f"{'':36} {'tokens/s':>12} {'ratio':>7} {'tokens/CPU-s':>14} {'ratio':>7}")
        for name, (rate, per_cpu) in best.items():
            print(f"{name:36} {rate:12.0f} {rate / base_rate:7.2f} {per_cpu:14.0f} {per_cpu / base_cpu:7.2f}")

    megatron_dir = args.megatron_dir or cache / "bench-tokens-2500x1000"
    startup(megatron_dir, args.rounds)
    if args.gpt_dataset:
        gpt_dataset(megatron_dir, args.gpt_samples)


if __name__ == "__main__":
    main()
