"""Values of npy batches against NumPy, epochs, shuffling."""

import math

import numpy as np
import pytest

import stoker
from conftest import N


def epoch_batches(loader):
    return [(b["data"].copy(), b["label"].copy()) for b in loader]


def test_sequential_batches_equal_numpy_slices(make_loader, npy_data):
    _, _, data, labels = npy_data
    loader = make_loader(num_workers=2)
    got = epoch_batches(loader)
    assert len(got) == len(loader) == math.ceil(N / 16)
    for k, (x, y) in enumerate(got):
        np.testing.assert_array_equal(x, data[16 * k : 16 * (k + 1)])
        np.testing.assert_array_equal(y, labels[16 * k : 16 * (k + 1)])
    assert got[-1][0].shape == (N % 16, 3, 8, 8)


def test_field_order_dtypes_and_shapes(make_loader):
    batch = next(iter(make_loader()))
    assert list(batch.keys()) == ["data", "label"]
    assert batch.size == 16 and len(batch) == 2
    fields = batch.fields()
    assert fields["data"].dtype == np.uint8 and fields["data"].shape == (16, 3, 8, 8)
    assert fields["label"].dtype == np.int64 and fields["label"].shape == (16,)
    assert batch.dtype("data") == "uint8"
    with pytest.raises(KeyError):
        batch["image"]


def test_drop_last(make_loader):
    loader = make_loader(drop_last=True)
    assert len(loader) == N // 16
    assert all(b.size == 16 for b in loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_visits_every_sample_once_with_matching_rows_and_labels(
    make_loader, npy_data, num_workers
):
    _, _, data, labels = npy_data
    row_of_label = {int(label): i for i, label in enumerate(labels)}
    loader = make_loader(shuffle=True, seed=42, num_workers=num_workers)
    orders = []
    for _ in range(2):
        order = []
        for x, y in epoch_batches(loader):
            rows = [row_of_label[int(label)] for label in y]
            np.testing.assert_array_equal(x, data[rows])  # each row came with its own label
            order += rows
        assert sorted(order) == list(range(N))
        orders.append(order)
    assert orders[0] != orders[1], "a new permutation every epoch"
    assert orders[0] != list(range(N))


def test_same_seed_same_order_whatever_the_workers(make_loader):
    def first_epoch_labels(**kw):
        return np.concatenate([y for _, y in epoch_batches(make_loader(shuffle=True, **kw))])

    a = first_epoch_labels(seed=5, num_workers=0)
    np.testing.assert_array_equal(a, first_epoch_labels(seed=5, num_workers=2))
    assert not np.array_equal(a, first_epoch_labels(seed=6, num_workers=2))


def test_end_of_epoch_then_next_epoch(make_loader):
    loader = make_loader()
    assert loader.epoch == 0
    first = epoch_batches(loader)
    assert loader.epoch == 1
    assert loader.next_batch() is not None  # the call after END starts epoch 1
    assert len(list(loader)) == len(first) - 1
    assert loader.epoch == 2
    batch = next(iter(loader))
    assert batch.epoch == 2
    np.testing.assert_array_equal(batch["label"], first[0][1])


def test_break_then_for_continues_the_same_epoch(make_loader, npy_data):
    labels = npy_data[3]
    loader = make_loader()
    for k, batch in enumerate(loader):
        if k == 2:
            break
    rest = [b["label"].copy() for b in loader]
    assert len(rest) == len(loader) - 3
    np.testing.assert_array_equal(np.concatenate(rest), labels[48:])


def test_option_values_are_converted_to_strings(make_loader, npy_data):
    loader = make_loader(shuffle=False, in_order=True, subset=[3, 1, 4], batch_size=8)
    assert loader.options["in_order"] == "true"
    assert loader.options["subset"] == "3,1,4"
    got = next(iter(loader))["label"]
    assert sorted(got) == sorted(npy_data[3][[3, 1, 4]])
