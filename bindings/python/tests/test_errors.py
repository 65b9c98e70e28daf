"""Library errors arrive as Python exceptions with the library's message."""

import ctypes.util

import pytest

import stoker


def test_unknown_option_key_names_the_key(npy_data):
    with pytest.raises(stoker.InvalidArgumentError, match="batchsize") as e:
        stoker.Loader(f"npy:{npy_data[0]}", batchsize=4)
    assert isinstance(e.value, ValueError) and isinstance(e.value, stoker.StokerError)
    assert e.value.status == -1


def test_malformed_value_names_the_key(npy_data):
    with pytest.raises(stoker.InvalidArgumentError, match="batch_size"):
        stoker.Loader(f"npy:{npy_data[0]}", batch_size=0)


def test_missing_file_is_an_io_error_naming_the_path(tmp_path):
    missing = tmp_path / "no_such_file.npy"
    with pytest.raises(stoker.StokerIOError, match="no_such_file.npy") as e:
        stoker.Loader(f"npy:{missing}")
    assert isinstance(e.value, OSError)


@pytest.mark.skipif(
    ctypes.util.find_library("cuda") is not None, reason="a CUDA driver is present"
)
def test_cuda_without_driver_is_unsupported(npy_data):
    with pytest.raises(stoker.UnsupportedError, match="cuda"):
        stoker.Loader(f"npy:{npy_data[0]}", device="cuda")


def test_closed_loader(make_loader):
    loader = make_loader()
    loader.close()
    loader.close()  # idempotent
    with pytest.raises(stoker.ClosedError):
        loader.next_batch()
    with pytest.raises(stoker.ClosedError):
        len(loader)


def test_context_manager_closes(make_loader):
    with make_loader() as loader:
        assert next(iter(loader)).size == 16
    with pytest.raises(stoker.ClosedError):
        loader.stats()
