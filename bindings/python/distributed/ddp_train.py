"""A small DDP training loop over stoker.torch.DataLoader, run by torchrun on CPU (gloo).

Every step, the ranks all_gather the sample ids of their batches; rank 0 appends them to a
JSON-lines log and checkpoints (loader state, model, epoch, step) after checking that every rank
saved the same loader state. `--kill-at STEP` SIGKILLs every rank right after that step's
checkpoint; `--resume` continues from the checkpoint, at whatever world size torchrun gives.
check_coverage.py then reads the log.

    torchrun --nproc_per_node=2 ddp_train.py --data DIR --sample-log LOG --ckpt CKPT --epochs 3
"""

import argparse
import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import stoker
from stoker.torch import DataLoader


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True, help="directory with x.npy (float32) and y.npy (ids)")
    p.add_argument("--sample-log", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--kill-at", type=int, default=0, help="global step after which to SIGKILL")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    # stoker finds the same place in the job from torchrun's variables on its own.
    where = stoker.launch()
    assert (where.rank, where.world_size, where.launcher) == (rank, world, "torchrun"), where
    assert where.local_rank == int(os.environ["LOCAL_RANK"])

    # Ranks seeded differently must still agree: the loader never draws per-rank seeds.
    torch.manual_seed(1000 + rank)
    loader = DataLoader(
        f"npy:{args.data}/x.npy",
        labels=f"npy:{args.data}/y.npy",
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=1,
        timeout=60,
        persistent_workers=True,
        worker_init_fn=lambda worker: None,
    )
    stats = loader.loader.stats()
    assert (stats.rank, stats.world_size, stats.launcher) == (rank, world, "torchrun")

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start_epoch, step = 0, 0
    if args.resume:
        with open(args.ckpt) as f:
            ckpt = json.load(f)
        loader.load_state_dict(ckpt["loader"])
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        model.module.load_state_dict({k: torch.tensor(v) for k, v in ckpt["model"].items()})

    log = open(args.sample_log, "a") if rank == 0 else None
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed epoch's position
        steps = 0
        for x, y in loader:
            loss = ((model(x).squeeze(1) - y.float() / 100.0) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            step += 1
            # Equal batch sizes on every rank (stoker deals equal shares), so all_gather works.
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
            dist.all_gather(sizes, torch.tensor([len(y)]))
            assert len({int(s) for s in sizes}) == 1, sizes
            gathered = [torch.zeros_like(y) for _ in range(world)]
            dist.all_gather(gathered, y)
            states = [None] * world
            dist.all_gather_object(states, loader.state_dict()["state"])
            assert len(set(states)) == 1, f"ranks saved different states: {states}"
            if rank == 0:
                ids = [int(i) for g in gathered for i in g]
                log.write(json.dumps({"world": world, "epoch": epoch, "step": step, "ids": ids}) + "\n")
                log.flush()
                model_state = {k: v.tolist() for k, v in model.module.state_dict().items()}
                ckpt = {"loader": {"state": states[0]}, "epoch": epoch, "step": step,
                        "model": model_state}
                with open(args.ckpt + ".tmp", "w") as f:
                    json.dump(ckpt, f)
                os.replace(args.ckpt + ".tmp", args.ckpt)
            if step == args.kill_at:
                dist.barrier()  # the checkpoint is written
                os.kill(os.getpid(), signal.SIGKILL)
        counts = [None] * world
        dist.all_gather_object(counts, steps)
        assert len(set(counts)) == 1, f"unequal step counts {counts}"
        if rank == 0:
            log.write(json.dumps({"world": world, "epoch_end": epoch, "steps": steps}) + "\n")
            log.flush()
    # Every rank is past its last collective before any closes its connections (gloo aborts a
    # peer still receiving from a rank that exited).
    dist.barrier()
    dist.destroy_process_group()
    if log is not None:
        log.close()
    # Leave without finalizing the interpreter. Gloo's worker threads free a finished collective's
    # tensors after waking the caller; one freed while Python finalizes takes the GIL, which ends
    # the thread with a forced unwind through a noexcept frame: std::terminate, SIGABRT
    # (pytorch/pytorch PR 179291). Under load this aborted about one run in fifteen here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
