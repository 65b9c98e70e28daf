"""Zero-copy views and their lifetime: arrays point into the batch's arena memory and keep it
alive after the Batch object and the Loader are gone."""

import ctypes
import gc

import numpy as np

from stoker import _ffi


def library_pointer(batch, name):
    """The ``stoker_tensor.data`` the C ABI reports for a field."""
    t = _ffi.Tensor()
    assert _ffi.lib.stoker_batch_field_by_name(batch._lease.ptr, name.encode(), ctypes.byref(t)) == 0
    return t.data


def test_arrays_are_views_of_the_library_memory(make_loader):
    batch = next(iter(make_loader()))
    for name in ("data", "label"):
        a = batch[name]
        assert a.ctypes.data == library_pointer(batch, name)
        assert a.__array_interface__["data"][0] == library_pointer(batch, name)
        assert not a.flags.owndata
        assert np.shares_memory(a, batch[name])
        assert a.flags.c_contiguous


def test_arrays_outlive_batch_and_loader(make_loader, npy_data):
    data, labels = npy_data[2], npy_data[3]
    loader = make_loader()
    kept = [(b["data"], b["label"]) for b in loader]  # Batch objects dropped at once
    loader.close()
    del loader
    gc.collect()
    for k, (x, y) in enumerate(kept):
        np.testing.assert_array_equal(x, data[16 * k : 16 * (k + 1)])
        np.testing.assert_array_equal(y, labels[16 * k : 16 * (k + 1)])


def test_held_arrays_are_not_recycled_while_the_loader_goes_on(make_loader, npy_data):
    data = npy_data[2]
    loader = make_loader(num_workers=2, prefetch_factor=1)
    first = next(iter(loader))["data"]
    for _ in range(3):  # many slab recycles later
        for batch in loader:
            batch["data"][:] = 0  # scribble over every other batch
    np.testing.assert_array_equal(first, data[:16])


def test_no_use_after_free_under_churn(make_loader, npy_data):
    data = npy_data[2]
    for round_ in range(30):
        loader = make_loader(shuffle=True, seed=round_, num_workers=2)
        batch = loader.next_batch()
        rows, labels = batch["data"], batch["label"]
        del batch, loader
        gc.collect()
        # Churn allocations so freed memory would be reused and overwritten.
        junk = [np.full(16 * 3 * 8 * 8, 0xAB, np.uint8) for _ in range(64)]
        row_of_label = {int(v): i for i, v in enumerate(npy_data[3])}
        np.testing.assert_array_equal(rows, data[[row_of_label[int(v)] for v in labels]])
        del junk


def test_views_keep_their_batch_alive_until_the_last_one_goes(make_loader):
    loader = make_loader()
    batch = loader.next_batch()
    lease = batch._lease
    view = batch["data"][2:5]  # a slice of a view: the lease is further down the base chain
    del batch
    gc.collect()
    assert lease.ptr is not None
    base = view
    while isinstance(base, np.ndarray):
        base = base.base
    assert base._lease is lease
