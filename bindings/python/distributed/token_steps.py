"""Global batches of a token stream under torchrun, checked against one process: the resume
matrix of a language-model job whose data-parallel size changes between runs.

Each run takes `--steps` global steps of `--global-batch` samples from a Megatron dataset. Every
rank reads its contiguous slice of each global batch in micro-batches of `--micro` samples (rank
and world size from torchrun's variables, found by stoker itself); the ranks all_gather their
slices and rank 0 appends the global batch to `--sample-log` (one JSON line a step). After the last step
rank 0 checks that every rank holds the same loader state and writes it to `--state`; `--resume`
starts from it.

    torchrun --nproc_per_node=8 token_steps.py --data PATTERN --sample-log LOG --state STATE --steps 2
    python token_steps.py --check --data PATTERN --sample-log LOG --steps 6

`--check` compares the log, line by line, with the same steps taken by one process holding the
whole global batch (rank 0 of 1), and exits non-zero on the first difference.
"""

import argparse
import datetime
import json
import sys

import numpy as np

import stoker

SEQ_LEN = 16


def options(args, **more):
    return dict(
        seq_len=SEQ_LEN,
        global_batch_size=args.global_batch,
        shuffle=True,
        seed=11,
        document_boundaries="reset",
        **more,
    )


def take(batches, loader, n):
    """`n` samples' input_ids from `batches` (a loader's iterator), crossing epoch ends."""
    rows = []
    while len(rows) < n:
        batch = next(batches, None)
        if batch is None:
            batches = iter(loader)
            continue
        rows.extend(batch["input_ids"].tolist())
    if len(rows) != n:
        raise SystemExit(f"micro-batches overshot the slice: {len(rows)} rows for {n}")
    return batches, rows


def run(args) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    state = open(args.state).read() if args.resume else None
    loader = stoker.Loader(
        f"megatron:{args.data}",
        **options(args, batch_size=args.micro, num_workers=args.workers, resume_state=state),
    )
    where = loader.stats()
    assert (where.rank, where.world_size, where.launcher) == (rank, world, "torchrun"), where
    share = args.global_batch // world
    batches = iter(loader)
    for _ in range(args.steps):
        batches, mine = take(batches, loader, share)
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            with open(args.sample_log, "a") as log:
                log.write(json.dumps([row for part in gathered for row in part]) + "\n")
    states = [None] * world
    dist.all_gather_object(states, loader.state_dict()["state"])
    if rank == 0:
        if len(set(states)) != 1:
            raise SystemExit(f"the ranks' loader states differ: {states}")
        with open(args.state, "w") as f:
            f.write(states[0])
    loader.close()
    dist.destroy_process_group()


def check(args) -> int:
    logged = [json.loads(line) for line in open(args.sample_log)]
    if len(logged) != args.steps:
        print(f"the log has {len(logged)} global steps, not {args.steps}")
        return 1
    loader = stoker.Loader(
        f"megatron:{args.data}",
        **options(args, batch_size=args.global_batch, num_workers=0, rank=0, world_size=1),
    )
    batches = iter(loader)
    for step, got in enumerate(logged):
        batches, want = take(batches, loader, args.global_batch)
        if not np.array_equal(np.array(got), np.array(want)):
            print(f"global step {step} differs from one process's")
            return 1
    print(f"{len(logged)} global steps equal one process's, sample for sample")
    return 0


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="Megatron dataset prefixes (a shard pattern)")
    p.add_argument("--sample-log", required=True)
    p.add_argument("--state", default=None)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--global-batch", type=int, default=24)
    p.add_argument("--micro", type=int, default=1, help="samples per micro-batch of a rank")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    if args.check:
        return check(args)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
