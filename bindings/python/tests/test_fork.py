"""fork() with a loader alive (multiprocessing workers, torch DataLoader workers): the child gets
stoker's UnsupportedError from a loader made before the fork, never a hang; a loader made in the
child works; the parent's loader goes on.

Each child runs under multiprocessing's fork start method; one that does not end within
HANG_LIMIT_S is killed and the test fails saying so. A child reports a failed check by raising,
which makes its exit code 1 (and prints the traceback).
"""

import gc
import multiprocessing
import threading

import numpy as np
import pytest
from _optional import import_torch

import stoker

HANG_LIMIT_S = 120  # far beyond what any child here needs; reached only by a hang

fork = multiprocessing.get_context("fork")


def run_in_child(target, *args):
    child = fork.Process(target=target, args=args)
    child.start()
    child.join(HANG_LIMIT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the forked child hung (killed after {HANG_LIMIT_S} s)")
    assert child.exitcode == 0, f"the child failed (exit code {child.exitcode}); see its stderr"


def expect_fork_error(call, parent_pid):
    with pytest.raises(stoker.UnsupportedError) as caught:
        call()
    message = str(caught.value)
    assert f"created in process {parent_pid} before fork()" in message, message
    assert "create a new loader after the fork" in message, message


def labels_of_epoch(loader):
    return sorted(int(x) for batch in loader for x in batch["label"])


def test_a_loader_made_before_fork_raises_in_the_child_and_goes_on_in_the_parent(
    make_loader, npy_data
):
    labels = npy_data[3]
    loader = make_loader(num_workers=2)
    iterator = iter(loader)
    held = [next(iterator)]  # a batch alive across the fork, released on each side
    first_labels = held[0]["label"].tolist()
    parent_pid = multiprocessing.current_process().pid

    def child():
        expect_fork_error(loader.next_batch, parent_pid)
        expect_fork_error(lambda: loader.set_epoch(1), parent_pid)
        expect_fork_error(loader.stats, parent_pid)
        assert loader.epoch == 0
        assert "state" in loader.state_dict()
        np.testing.assert_array_equal(held[0]["label"], labels[:16])
        held.clear()  # releases the batch
        gc.collect()
        loader.close()  # leaks the parent's loader instead of joining its threads

    run_in_child(child)

    held.clear()
    rest = [int(x) for batch in iterator for x in batch["label"]]
    assert sorted(first_labels + rest) == sorted(labels.tolist())
    assert labels_of_epoch(loader) == sorted(labels.tolist())
    assert loader.stats().batches == 2 * len(loader)
    loader.close()


def test_a_loader_made_in_the_child_works(make_loader, npy_data):
    labels = sorted(npy_data[3].tolist())
    parent_loader = make_loader(num_workers=2)
    next(iter(parent_loader))

    def child():
        with make_loader(num_workers=2, shuffle=True, seed=5) as mine:
            assert labels_of_epoch(mine) == labels
            assert labels_of_epoch(mine) == labels
            assert mine.stats().batches == 2 * len(mine)

    run_in_child(child)
    parent_loader.close()


class Gated:
    """A map-style dataset whose sample 20 waits for `gate`: a thread iterating it blocks inside
    `next_batch`, holding the loader's lock."""

    def __init__(self):
        self.gate = threading.Event()

    def __len__(self):
        return 32

    def __getitem__(self, i):
        if i == 20:
            self.gate.wait()
        return {"x": np.full(3, i, dtype=np.int64), "label": i}


def test_a_parent_thread_waiting_in_next_at_the_fork_does_not_block_the_child():
    ds = Gated()
    # concurrent_getitem: sample 20's wait must not hold up the other worker's calls (by default
    # they take turns), or batch 1 may never arrive and the wait below never ends.
    loader = stoker.Loader(ds, batch_size=8, num_workers=2, concurrent_getitem=True)
    parent_pid = multiprocessing.current_process().pid
    seen = []

    def consume():
        for batch in loader:
            seen.append(batch["label"].tolist())

    consumer = threading.Thread(target=consume)
    consumer.start()
    while len(seen) < 2 and consumer.is_alive():  # batch 2 holds sample 20, which waits
        consumer.join(0.01)
    assert consumer.is_alive() and len(seen) == 2

    def child():
        expect_fork_error(loader.next_batch, parent_pid)
        expect_fork_error(loader.stats, parent_pid)

    run_in_child(child)

    ds.gate.set()
    consumer.join()
    assert sorted(x for batch in seen for x in batch) == list(range(32))
    loader.close()


def test_torch_dataloader_workers_make_their_own_loaders(make_loader, npy_data):
    torch = import_torch()
    data_path, labels_path, _, labels = npy_data

    class LazyStoker(torch.utils.data.IterableDataset):
        """Makes its stoker loader in the worker that iterates it, after the fork."""

        def __iter__(self):
            loader = stoker.Loader(
                f"npy:{data_path}", labels=f"npy:{labels_path}", batch_size=16, num_workers=1
            )
            with loader:
                for batch in loader:
                    yield torch.from_numpy(batch["label"].copy())

    # The parent has a loader with live threads when the DataLoader forks its workers.
    parent_loader = make_loader(num_workers=2)
    next(iter(parent_loader))
    data_loader = torch.utils.data.DataLoader(
        LazyStoker(),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=HANG_LIMIT_S,
    )
    got = sorted(int(x) for t in data_loader for x in t)
    # Each of the two workers reads the whole dataset.
    assert got == sorted(labels.tolist() * 2)
    parent_loader.close()
