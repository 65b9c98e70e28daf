"""Shared fixtures: small npy datasets whose every row says which sample it is."""

import numpy as np
import pytest

N, SHAPE = 103, (3, 8, 8)  # 103: batches of 16 end with a short one


@pytest.fixture
def npy_data(tmp_path):
    """(data.npy path, labels.npy path, data array, labels array).

    Rows are random, labels are a permutation, so a wrong row or a wrong label pairing shows.
    """
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, size=(N, *SHAPE), dtype=np.uint8)
    labels = rng.permutation(N).astype(np.int64) + 1000
    data_path, labels_path = tmp_path / "data.npy", tmp_path / "labels.npy"
    np.save(data_path, data)
    np.save(labels_path, labels)
    return data_path, labels_path, data, labels


@pytest.fixture
def make_loader(npy_data):
    """Builds a loader over npy_data; keyword arguments override the defaults."""
    data_path, labels_path, _, _ = npy_data

    def make(**options):
        options.setdefault("labels", f"npy:{labels_path}")
        options.setdefault("batch_size", 16)
        return __import__("stoker").Loader(f"npy:{data_path}", **options)

    return make
