"""state_dict / load_state_dict resume exactly; stats report what happened."""

import numpy as np
import pytest

import stoker


def labels_of(loader, n):
    return [loader.next_batch()["label"].copy() for _ in range(n)]


def test_resume_mid_epoch_reproduces_the_uninterrupted_sequence(make_loader):
    reference = make_loader(shuffle=True, seed=9, num_workers=2)
    per_epoch = len(reference)
    want = labels_of(reference, per_epoch)  # epoch 0
    assert reference.next_batch() is None
    want += labels_of(reference, per_epoch)  # epoch 1

    loader = make_loader(shuffle=True, seed=9, num_workers=2)
    got = labels_of(loader, 3)
    state = loader.state_dict()
    assert set(state) == {"state"} and isinstance(state["state"], str)
    loader.close()

    resumed = make_loader(shuffle=True, seed=9, num_workers=2)
    resumed.load_state_dict(state)
    got += labels_of(resumed, per_epoch - 3)
    assert resumed.next_batch() is None
    got += labels_of(resumed, per_epoch)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_resume_state_as_an_option(make_loader):
    loader = make_loader(shuffle=True, seed=3)
    labels_of(loader, 2)
    state = loader.state_dict()["state"]
    want = labels_of(loader, 2)
    again = make_loader(shuffle=True, seed=3, resume_state=state)
    for a, b in zip(labels_of(again, 2), want):
        np.testing.assert_array_equal(a, b)


def test_stats_after_one_epoch(make_loader, npy_data):
    loader = make_loader(num_workers=2)
    n = sum(1 for _ in loader)
    stats = loader.stats()
    assert isinstance(stats, stoker.Stats)
    assert stats.batches == n == len(loader)
    assert stats.samples == len(npy_data[3])
    assert stats.samples_skipped == 0
    assert stats.elapsed_ns > 0
    assert stats.wait_ns_p50 <= stats.wait_ns_p95 <= stats.wait_ns_max <= stats.wait_ns_total
    assert 0.0 <= stats.readiness <= 1.0 and 0.0 <= stats.worker_busy <= 1.0
    # Where the time went: an npy source is read and collated, never decoded or transformed.
    assert stats.num_workers == 2 and len(stats.worker_busy_ns) == 2
    assert stats.read_ns > 0 and stats.collate_ns > 0
    assert stats.decode_ns == stats.transform_ns == stats.h2d_ns == 0
    assert stats.read_ns + stats.collate_ns <= stats.busy_ns
    assert sum(stats.worker_busy_ns) <= stats.busy_ns
    assert 0 < stats.read_ns_p50 <= stats.read_ns_p95


def test_memory_budget_lowers_the_in_flight_cap_or_refuses_a_batch_that_cannot_fit(make_loader):
    loader = make_loader(num_workers=2, prefetch_factor=4)
    stats = loader.stats()
    assert stats.in_flight_cap == stats.in_flight_cap_requested == 8
    assert 0 < stats.batch_bytes <= stats.memory_budget
    one_batch = stats.batch_bytes
    # Within the cap it builds num_workers + 1 ahead until the consumer's waits ask for more;
    # the batch memory mapped is what those batches hold (and any kept idle for reuse).
    for _ in zip(range(20), loader):
        pass
    stats = loader.stats()
    assert 3 <= stats.in_flight_depth <= stats.in_flight_cap
    assert 0 < stats.batch_memory_bytes <= stats.batch_memory_peak_bytes
    assert stats.batch_memory_peak_bytes <= (stats.in_flight_cap + 2) * one_batch
    # Mapping the slabs touched each of their pages once: faults were taken, and counted.
    assert stats.page_faults > 0

    with pytest.raises(stoker.InvalidArgumentError, match="memory_budget") as err:
        make_loader(memory_budget=one_batch - 1)
    assert f"{one_batch - 1} bytes" in str(err.value)

    lowered = make_loader(num_workers=2, prefetch_factor=4, memory_budget=2 * one_batch)
    stats = lowered.stats()
    assert (stats.in_flight_cap, stats.in_flight_cap_requested) == (2, 8)
    assert stats.memory_budget == 2 * one_batch
    assert sum(len(b["label"]) for b in lowered) == 103


def test_autotune_and_trace(make_loader, tmp_path):
    import json

    path = tmp_path / "trace.json"
    loader = make_loader(autotune=True, trace=path)
    stats = loader.stats()
    assert stats.num_workers == 1 and stats.prefetch_factor == 2 and stats.autotune_decisions == 0
    assert sum(len(b["label"]) for b in loader) == 103
    loader.close()
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e["name"] == "batch" and e["ph"] == "X" for e in events)
    assert any(e["name"] == "wait" for e in events)
