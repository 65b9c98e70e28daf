"""Many ranks from Python: launcher variables, equal shares of one global order, set_epoch,
elastic resume from a state that is the same on every rank, and its fingerprint."""

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

import stoker

LAUNCH_VARS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
]

# Run in a child process with the launcher variables given: the loader reads its own
# environment, so the parent's is left alone.
CHILD = """
import json, sys, stoker
path, labels = sys.argv[1], sys.argv[2]
try:
    loader = stoker.Loader("npy:" + path, labels="npy:" + labels, batch_size=4, shuffle=True,
                           seed=5, num_workers=1)
except stoker.StokerError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
s = loader.stats()
ids = [int(i) for b in loader for i in b["label"]]
print(json.dumps({"rank": s.rank, "world_size": s.world_size, "local_rank": s.local_rank,
                  "local_world_size": s.local_world_size, "launcher": s.launcher, "ids": ids}))
"""


def run_child(npy_data, env):
    data_path, labels_path, _, _ = npy_data
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    clean.update(env)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(data_path), str(labels_path)],
        env=clean, capture_output=True, text=True, timeout=120, check=True,
    )
    return json.loads(out.stdout)


def ids_of(loader):
    return [int(i) for b in loader for i in b["label"]]


def test_slurm_variables_make_each_task_a_rank(npy_data):
    _, _, _, labels = npy_data
    shares = []
    for task in range(3):
        got = run_child(npy_data, {
            "SLURM_PROCID": str(task), "SLURM_NTASKS": "3", "SLURM_LOCALID": str(task % 2),
            "SLURM_NODEID": str(task // 2), "SLURM_TASKS_PER_NODE": "2,1",
        })
        assert (got["rank"], got["world_size"], got["launcher"]) == (task, 3, "slurm")
        assert (got["local_rank"], got["local_world_size"]) == (task % 2, [2, 2, 1][task])
        shares.append(got["ids"])
    assert len({len(s) for s in shares}) == 1, "equal shares"
    everything = Counter(i for s in shares for i in s)
    assert set(everything) == set(int(v) for v in labels), "every sample on some rank"
    assert sum(everything.values()) - len(labels) == (-len(labels)) % 3, "only padding repeats"


def test_torchrun_variables_and_disagreeing_launchers(npy_data):
    got = run_child(npy_data, {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
                               "LOCAL_WORLD_SIZE": "2"})
    assert (got["rank"], got["world_size"], got["launcher"]) == (1, 2, "torchrun")
    stale = run_child(npy_data, {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "3",
                                 "SLURM_NTASKS": "4"})
    assert "RANK=0" in stale["error"] and "SLURM_NTASKS=4" in stale["error"], stale


def test_launch_resolves_explicit_values_and_says_who():
    where = stoker.launch(rank=2, world_size=4)
    assert (where.rank, where.world_size, where.launcher) == (2, 4, "explicit")
    with pytest.raises(stoker.InvalidArgumentError, match="rank 4"):
        stoker.launch(rank=4, world_size=4)


def test_stats_report_the_resolved_rank(make_loader):
    s = make_loader(rank=1, world_size=3).stats()
    assert (s.rank, s.world_size, s.launcher) == (1, 3, "explicit")


def test_set_epoch_starts_that_epoch(make_loader):
    reference = make_loader(shuffle=True, seed=2, num_workers=2)
    for _ in range(4):
        ids_of(reference)
    epoch4 = ids_of(reference)
    loader = make_loader(shuffle=True, seed=2, num_workers=2)
    held = loader.next_batch()
    loader.set_epoch(4)
    assert loader.epoch == 4
    assert ids_of(loader) == epoch4
    assert len(held["label"]) == 16, "a held batch stays valid"
    with pytest.raises(ValueError):
        loader.set_epoch(-1)


def test_elastic_resume_from_two_ranks_to_three(make_loader, npy_data):
    _, _, _, labels = npy_data
    options = dict(shuffle=True, seed=8, batch_size=4, num_workers=1)
    seen = []
    states = set()
    for rank in range(2):
        loader = make_loader(rank=rank, world_size=2, **options)
        for _ in range(5):
            seen += [int(i) for i in loader.next_batch()["label"]]
        states.add(loader.state_dict()["state"])
    assert len(states) == 1, f"every rank saves the same state: {states}"
    (state,) = states
    counts = []
    for rank in range(3):
        loader = make_loader(rank=rank, world_size=3, resume_state=state, **options)
        mine = ids_of(loader)
        counts.append(len(mine))
        seen += mine
    assert len(set(counts)) == 1
    everything = Counter(seen)
    assert set(everything) == set(int(v) for v in labels)
    remaining = len(labels) - 5 * 4 * 2
    assert sum(everything.values()) == 40 + remaining + (-remaining) % 3, "only padding repeats"


def test_resume_with_another_batch_size_names_it(make_loader):
    loader = make_loader(shuffle=True, batch_size=4)
    loader.next_batch()
    state = loader.state_dict()["state"]
    with pytest.raises(stoker.InvalidArgumentError, match=r"batch_size \(4 there, 8 here\)"):
        make_loader(shuffle=True, batch_size=8, resume_state=state)
    # A state of the first format still resumes (at the same world size).
    sequential = [b["label"].copy() for b in make_loader(batch_size=4)]
    old = "stoker-state-v1;seed=0;epoch=0;position=1;ahead=;batches=26"
    resumed = make_loader(batch_size=4, resume_state=old)
    np.testing.assert_array_equal(resumed.next_batch()["label"], sequential[1])
