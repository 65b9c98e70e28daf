"""Torch tensors through DLPack: no copy, right dtypes, valid after batch and loader are gone."""

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_torch_tensors_share_the_batch_memory(make_loader, npy_data):
    batch = next(iter(make_loader()))
    tensors = batch.torch()
    assert set(tensors) == {"data", "label"}
    assert tensors["data"].dtype == torch.uint8 and tensors["label"].dtype == torch.int64
    assert tensors["data"].data_ptr() == batch["data"].ctypes.data
    np.testing.assert_array_equal(tensors["data"].numpy(), npy_data[2][:16])


def test_from_dlpack_on_a_field(make_loader):
    batch = next(iter(make_loader()))
    field = batch.dlpack("label")
    assert field.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(field)
    assert t.data_ptr() == batch["label"].ctypes.data


def test_tensors_outlive_batch_and_loader(make_loader, npy_data):
    loader = make_loader(num_workers=2)
    kept = [b.torch()["data"] for b in loader]
    loader.close()
    del loader
    gc.collect()
    for k, t in enumerate(kept):
        np.testing.assert_array_equal(t.numpy(), npy_data[2][16 * k : 16 * (k + 1)])


def test_unconsumed_capsule_frees_its_export(make_loader):
    batch = next(iter(make_loader()))
    for _ in range(1000):
        capsule = batch.dlpack("data").__dlpack__(max_version=(1, 0))
        del capsule  # the capsule destructor runs the export's deleter
    gc.collect()


def test_consumer_without_versioned_dlpack_is_refused(make_loader):
    batch = next(iter(make_loader()))
    with pytest.raises(BufferError):
        batch.dlpack("data").__dlpack__()
