"""Library errors arrive as Python exceptions with the library's message."""

import ctypes.util
import threading
import time

import numpy as np
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


def test_close_from_another_thread_wakes_a_waiting_next():
    # Sample 1 stalls until the test lets it go: the main thread waits inside next_batch (the
    # GIL released) until another thread closes the loader.
    release = threading.Event()

    class Stalls:
        def __len__(self):
            return 16

        def __getitem__(self, i):
            if i == 1:
                release.wait(timeout=30)
            return np.full(3, i, dtype=np.int64)

    loader = stoker.Loader(Stalls(), batch_size=2, num_workers=2)
    closer = threading.Thread(target=lambda: (time.sleep(0.1), loader.close()))
    start = time.monotonic()
    closer.start()
    with pytest.raises(stoker.ClosedError, match="closed"):
        loader.next_batch()
    waited = time.monotonic() - start
    # close() frees the loader once its workers finish; the stalled read finishes now.
    release.set()
    closer.join(timeout=30)
    assert not closer.is_alive()
    assert waited < 10, f"next_batch returned after {waited:.1f} s, not when closed"
    with pytest.raises(stoker.ClosedError):
        loader.next_batch()


def test_context_manager_closes(make_loader):
    with make_loader() as loader:
        assert next(iter(loader)).size == 16
    with pytest.raises(stoker.ClosedError):
        loader.stats()


def test_a_wrong_path_is_said_in_words(tmp_path):
    folder = tmp_path / "data.npy"
    folder.mkdir()
    with pytest.raises(stoker.StokerIOError, match="is a directory, not an .npy file"):
        stoker.Loader(f"npy:{folder}")
    with pytest.raises(stoker.StokerIOError, match="not found"):
        stoker.Loader(f"npy:{tmp_path / 'missing.npy'}")
    with pytest.raises(stoker.StokerIOError, match="is a file, not a directory"):
        (tmp_path / "file").write_bytes(b"x")
        stoker.Loader(f"image_folder:{tmp_path / 'file'}")
