"""Code a user writes against the installed package, type-checked and never run: run_tests.sh
runs ``mypy --strict`` on it, so a wheel without ``py.typed`` or a public function without
annotations fails the test command."""

from __future__ import annotations

from typing import Any

from numpy.typing import NDArray

import stoker


def train_one_epoch(path: str) -> tuple[NDArray[Any], float, dict[str, str]]:
    with stoker.Loader(f"npy:{path}", batch_size=4, shuffle=True, seed=1) as loader:
        n_batches: int = len(loader)
        epoch: int = loader.epoch
        last: NDArray[Any] | None = None
        for batch in loader:
            last = batch["data"]
            size: int = batch.size
            assert size <= 4 and n_batches >= 0 and epoch >= 0
        stats: stoker.Stats = loader.stats()
        state: dict[str, str] = loader.state_dict()
    if last is None:
        raise stoker.InvalidArgumentError("empty dataset")
    return last, stats.readiness, state


def resume(path: str, state: dict[str, str]) -> stoker.Batch | None:
    loader = stoker.Loader(f"npy:{path}", batch_size=4)
    loader.load_state_dict(state)
    try:
        return loader.next_batch()
    except stoker.StokerError as e:
        print(e.message, e.status)
        return None
    finally:
        loader.close()


def pack_then_read(root: str, out: str) -> int:
    stoker.pack(f"image_folder:{root}", out, max_side=256, quality=90, mode="raw")
    for i in range(2):
        stoker.pack(f"image_folder:{root}", f"{out}.d", shard_size=1 << 30, shard_index=i, num_shards=2)
    stoker.pack_merge(f"{out}.d")
    with stoker.Loader(f"packed:{out}", batch_size=4, order="quasi_random", shuffle=True) as loader:
        return len(loader)
