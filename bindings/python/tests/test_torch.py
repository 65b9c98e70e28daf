"""Torch tensors through DLPack: no copy, right dtypes, valid after batch and loader are gone."""

import gc

import numpy as np
import pytest
from _optional import import_torch

torch = import_torch()


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


def test_dataloader_adapter_yields_tensor_tuples(npy_data):
    from stoker.torch import DataLoader

    data_path, labels_path, data, labels = npy_data
    loader = DataLoader(
        f"npy:{data_path}", labels=f"npy:{labels_path}", batch_size=16, num_workers=2,
        drop_last=True, prefetch_factor=2, persistent_workers=True,
    )
    assert len(loader) == len(data) // 16
    batches = list(loader)
    assert len(batches) == len(loader)
    x, y = batches[1]
    assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and y.dtype == torch.int64
    np.testing.assert_array_equal(x.numpy(), data[16:32])
    np.testing.assert_array_equal(y.numpy(), labels[16:32])


def test_dataloader_adapter_every_for_is_a_whole_epoch(npy_data):
    from stoker.torch import DataLoader

    data_path, _, data, _ = npy_data
    loader = DataLoader(f"npy:{data_path}", batch_size=16)
    for k, (x,) in enumerate(loader):
        if k == 1:
            break
    first = [x for (x,) in loader]
    assert len(first) == len(loader)
    np.testing.assert_array_equal(first[0].numpy(), data[:16])
    assert loader.loader.epoch == 2


def test_dataloader_adapter_shuffle_follows_torch_manual_seed(npy_data):
    from stoker.torch import DataLoader

    def first_batch():
        return next(iter(DataLoader(f"npy:{npy_data[0]}", batch_size=16, shuffle=True)))[0]

    torch.manual_seed(1)
    a = first_batch()
    torch.manual_seed(1)
    assert torch.equal(a, first_batch())
    torch.manual_seed(2)
    assert not torch.equal(a, first_batch())
