"""Soak: hundreds of epochs with loaders created and dropped mid-epoch, at seeded random points,
from several Python threads, over the npy source and over a Python dataset (the source
callbacks). After a warm-up (epoch 10) resident memory and open file descriptors stay flat to
the end, and no loader thread is left behind. The figures are printed (``pytest -s`` or not)."""

import gc
import os
import random
import threading

import numpy as np

import stoker

EPOCHS, WARM_UP, THREADS = 300, 10, 4
# Generous: allocator arenas and thread-stack caches settle after warm-up. A batch slab or a
# thread stack leaked per batch (~2100) or per loader (~200) exceeds the mapping bound by far;
# the ~2 MB per epoch once reported would exceed the memory bound twenty times over.
RSS_SLACK = 16 << 20
FD_SLACK = 4
MAPS_SLACK = 64


def figures(epoch):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {"epoch": epoch, "rss": rss, "fds": len(os.listdir("/proc/self/fd")), "maps": maps}


def stoker_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # the thread ended while we looked
            pass
    return [n for n in names if n.startswith("stoker-")]


ROW = (16, 32, 32)  # 16 KiB a sample, 256 KiB a batch of 16: a leaked batch shows


class Rows:
    """A Python dataset: 64 samples of a uint8 tensor and a label."""

    def __init__(self):
        self.x = np.random.default_rng(5).integers(0, 256, (64, *ROW), dtype=np.uint8)

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return self.x[i], i


def test_soak_hundreds_of_epochs_keep_memory_fds_and_threads_flat(tmp_path, capsys):
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, (103, *ROW), dtype=np.uint8)
    data_path, labels_path = tmp_path / "data.npy", tmp_path / "labels.npy"
    np.save(data_path, data)
    np.save(labels_path, np.arange(103, dtype=np.int64))
    dataset = Rows()
    batches_per_epoch = 7  # 103 samples in batches of 16, and 64 in batches of 10
    state = {"batches": 0, "warm": None, "stop": False, "failure": None, "loaders": 0}
    lock = threading.Lock()

    def leader():
        gc.collect()
        epoch = state["batches"] // batches_per_epoch
        if state["warm"] is None and epoch >= WARM_UP:
            state["warm"] = figures(epoch)
        state["stop"] = epoch >= EPOCHS or state["failure"] is not None

    barrier = threading.Barrier(THREADS, action=leader)

    def one_loader(rng):
        options = dict(
            num_workers=rng.randrange(4),
            prefetch_factor=rng.choice([1, 2, 4]),
            shuffle=rng.random() < 0.5,
            in_order=rng.random() < 0.75,
            seed=rng.randrange(2**32),
        )
        if rng.random() < 0.25:
            loader = stoker.Loader(dataset, batch_size=10, **options)
        else:
            loader = stoker.Loader(
                f"npy:{data_path}", labels=f"npy:{labels_path}", batch_size=16, **options
            )
        kept = None
        stop_after = rng.randrange(3 * batches_per_epoch + 1)
        for n in range(stop_after):
            batch = loader.next_batch()
            if batch is None:
                continue  # end of an epoch; the next call starts the next one
            assert batch["data"].shape[0] in (4, 7, 10, 16)
            with lock:
                state["batches"] += 1
            if n == stop_after // 2 and rng.random() < 0.3:
                kept = batch["data"]  # an array outliving its loader
        if rng.random() < 0.5:
            loader.close()
        del loader
        if kept is not None:
            assert kept.dtype == np.uint8 and kept.shape[0] in (4, 7, 10, 16)

    def run(t):
        rng = random.Random(1000 + t)
        for _round in range(1000):  # bounded; ~50 rounds reach EPOCHS
            try:
                one_loader(rng)
            except Exception as e:  # recorded, so that no thread leaves the barrier early
                with lock:
                    state["failure"] = state["failure"] or repr(e)
            with lock:
                state["loaders"] += 1
            barrier.wait(timeout=60)
            if state["stop"]:
                return

    threads = [threading.Thread(target=run, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a soak thread did not finish"
    assert state["failure"] is None, state["failure"]
    gc.collect()
    end, warm = figures(state["batches"] // batches_per_epoch), state["warm"]
    with capsys.disabled():
        print(f"\nsoak (python): {state['loaders']} loaders on {THREADS} threads, {end['epoch']} epochs")
        for f in (warm, end):
            print(
                f"soak (python): at epoch {f['epoch']:>3}: RSS {f['rss'] / 2**20:.1f} MiB, "
                f"{f['fds']} open fds, {f['maps']} memory mappings"
            )
    assert end["epoch"] >= EPOCHS
    assert end["rss"] <= warm["rss"] + RSS_SLACK, (warm, end)
    assert end["fds"] <= warm["fds"] + FD_SLACK, (warm, end)
    assert end["maps"] <= warm["maps"] + MAPS_SLACK, (warm, end)
    assert stoker_threads() == [], stoker_threads()
    # The data a loader delivers is still right after all that churn.
    with stoker.Loader(f"npy:{data_path}", batch_size=16) as loader:
        np.testing.assert_array_equal(next(iter(loader))["data"], data[:16])
