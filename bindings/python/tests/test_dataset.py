"""A Python map-style dataset as the source (the C ABI's source callbacks)."""

import gc
import io
import weakref

import numpy as np
import pytest

import stoker


class Arrays:
    """Dataset of dicts: a float32 vector, an int32 matrix and a label."""

    def __init__(self, n=37):
        rng = np.random.default_rng(1)
        self.x = rng.standard_normal((n, 5)).astype(np.float32)
        self.m = rng.integers(-9, 9, (n, 2, 3), dtype=np.int32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "m": self.m[i], "label": i * 10}


def test_dict_samples_collate_into_fields(tmp_path):
    ds = Arrays()
    loader = stoker.Loader(ds, batch_size=8, shuffle=True, seed=4, num_workers=2)
    assert len(loader) == 5
    seen = []
    for batch in loader:
        assert list(batch) == ["x", "m", "label"]
        rows = batch["label"] // 10
        np.testing.assert_array_equal(batch["x"], ds.x[rows])
        np.testing.assert_array_equal(batch["m"], ds.m[rows])
        seen += rows.tolist()
    assert sorted(seen) == list(range(len(ds)))


def test_pairs_of_array_and_label():
    data = np.arange(20 * 4, dtype=np.uint8).reshape(20, 4)

    class Pairs:
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return data[i], int(i % 3)

    batch = next(iter(stoker.Loader(Pairs(), batch_size=20)))
    assert list(batch) == ["data", "label"]
    np.testing.assert_array_equal(batch["data"], data)
    np.testing.assert_array_equal(batch["label"], np.arange(20) % 3)


def test_encoded_images_are_decoded_and_transformed():
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    pixels = [rng.integers(0, 256, (12, 16, 3), dtype=np.uint8) for _ in range(4)]

    class Pngs:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            buf = io.BytesIO()
            Image.fromarray(pixels[i]).save(buf, format="PNG")
            return buf.getvalue(), i

    batch = next(iter(stoker.Loader(Pngs(), batch_size=4, transform="resize(12, 16)")))
    assert batch["image"].shape == (4, 3, 12, 16)
    for i in range(4):
        np.testing.assert_array_equal(batch["image"][i], pixels[i].transpose(2, 0, 1))
    np.testing.assert_array_equal(batch["label"], [0, 1, 2, 3])


def test_exception_in_getitem_is_a_callback_error_naming_index_and_cause():
    class Broken(Arrays):
        def __getitem__(self, i):
            if i == 13:
                raise KeyError("sample thirteen is missing")
            return super().__getitem__(i)

    loader = stoker.Loader(Broken(), batch_size=8, num_workers=2)
    with pytest.raises(stoker.CallbackError, match=r"dataset\[13\].*thirteen") as caught:
        for _ in loader:
            pass
    # The dataset's own exception is the cause, with the traceback of its __getitem__, as
    # torch's DataLoader shows the worker's.
    cause = caught.value.__cause__
    assert isinstance(cause, KeyError) and cause.args == ("sample thirteen is missing",)
    import traceback

    assert "__getitem__" in "".join(traceback.format_tb(cause.__traceback__))


def test_skip_replaces_failing_samples_and_counts_them():
    class Broken(Arrays):
        def __getitem__(self, i):
            if i % 10 == 5:
                raise ValueError("bad")
            return super().__getitem__(i)

    loader = stoker.Loader(Broken(), batch_size=8, on_error="skip")
    labels = np.concatenate([b["label"] for b in loader])
    assert len(labels) == 37 and not any(label // 10 % 10 == 5 for label in labels)
    assert loader.stats().samples_skipped == 4


def test_unsupported_dtype_is_reported():
    class Complex:
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"z": np.zeros(3, np.complex64)}

    with pytest.raises(stoker.StokerError, match="complex64"):
        stoker.Loader(Complex(), batch_size=2)


def test_not_a_dataset_is_a_type_error():
    with pytest.raises(TypeError, match="map-style dataset"):
        stoker.Loader(42)


def test_dataset_is_released_when_the_loader_is_freed():
    ds = Arrays()
    ref = weakref.ref(ds)
    loader = stoker.Loader(ds, batch_size=8, num_workers=2)
    state = None
    for k, _ in enumerate(loader):
        if k == 1:
            state = loader.state_dict()
            break
    loader.load_state_dict(state)  # rebuilt over the same dataset
    assert next(iter(loader))["label"][0] == 160
    del ds, loader
    gc.collect()
    assert ref() is None


def test_interpreter_exits_cleanly_with_a_dataset_loader_mid_epoch():
    """Workers must not call into a finalizing interpreter (that aborts the process)."""
    import subprocess
    import sys

    code = """
import time
import numpy as np
import stoker

class Slow:
    def __len__(self):
        return 10000
    def __getitem__(self, i):
        time.sleep(0.001)
        return {"x": np.full(100, i, np.float32)}

loader = stoker.Loader(Slow(), batch_size=32, num_workers=2, prefetch_factor=4)
it = iter(loader)
next(it)
print("ok")
"""
    for _ in range(3):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout.strip()) == (0, "ok"), result.stderr


class Sequences:
    """Variable-length int32 token sequences: sample i has i % 5 tokens, 100*i + k."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        tokens = np.array([100 * i + k for k in range(i % 5)], dtype=np.int32)
        return {"tokens": tokens, "label": i}


def test_ragged_sequences_are_padded_with_lengths():
    loader = stoker.Loader(Sequences(), batch_size=6, pad=-1, shuffle=True, seed=2, num_workers=2)
    seen = []
    for batch in loader:
        assert list(batch) == ["tokens", "label", "tokens_lengths"]
        tokens, labels, lengths = batch["tokens"], batch["label"], batch["tokens_lengths"]
        assert tokens.shape[1] == lengths.max()  # padded to this batch's longest
        for row, i, n in zip(tokens, labels, lengths):
            assert n == i % 5
            np.testing.assert_array_equal(row[:n], 100 * i + np.arange(n))
            assert (row[n:] == -1).all()
        seen += labels.tolist()
    assert sorted(seen) == list(range(23))


def test_ragged_offsets_give_the_padded_values_end_to_end():
    padded = stoker.Loader(Sequences(), batch_size=6, pad=-1, shuffle=True, seed=2)
    flat = stoker.Loader(Sequences(), batch_size=6, ragged="offsets", shuffle=True, seed=2,
                         num_workers=2)
    batches = 0
    for p, f in zip(padded, flat, strict=True):
        assert list(f) == ["tokens", "label", "tokens_offsets"]
        values, offsets = f["tokens"], f["tokens_offsets"]
        assert offsets.dtype == np.int64 and offsets.shape == (f.size + 1,)
        assert f.size == p.size == len(p["label"])
        assert offsets[0] == 0 and values.shape == (offsets[-1],)  # no padding
        np.testing.assert_array_equal(np.diff(offsets), p["tokens_lengths"])
        np.testing.assert_array_equal(f["label"], p["label"])
        for k, n in enumerate(p["tokens_lengths"]):
            np.testing.assert_array_equal(values[offsets[k] : offsets[k + 1]], p["tokens"][k, :n])
        batches += 1
    assert batches == 4


def test_ragged_offsets_make_a_nested_tensor_with_torch():
    torch = pytest.importorskip("torch")
    loader = stoker.Loader(Sequences(), batch_size=6, ragged="offsets", shuffle=True, seed=2)
    for batch in loader:
        out = batch.torch()
        nested = torch.nested.nested_tensor_from_jagged(out["tokens"], out["tokens_offsets"])
        samples = nested.unbind()
        assert len(samples) == len(out["label"])
        for tokens, i in zip(samples, out["label"].tolist()):
            assert tokens.dtype == torch.int32
            assert tokens.tolist() == [100 * i + k for k in range(i % 5)]


def test_same_batches_for_any_num_workers():
    def labels_of(workers):
        loader = stoker.Loader(Arrays(), batch_size=5, shuffle=True, seed=9, num_workers=workers)
        return [b["label"].tolist() for epoch in range(2) for b in loader]

    reference = labels_of(0)
    assert labels_of(1) == reference
    assert labels_of(2) == reference


def test_encoded_jpegs_give_the_pixels_of_image_folder(tmp_path):
    """The same JPEG files through __getitem__ and through image_folder: identical batches."""
    import pathlib
    import shutil

    fixtures = pathlib.Path(__file__).parents[3] / "crates/stoker-core/tests/data/images"
    files = ["photo_baseline.jpg", "photo_progressive.jpg", "photo_gray.jpg", "photo_cmyk.jpg"]
    for k, name in enumerate(files):
        (tmp_path / f"class{k % 2}").mkdir(exist_ok=True)
        shutil.copy(fixtures / name, tmp_path / f"class{k % 2}" / name)
    paths = sorted(tmp_path.glob("*/*.jpg"))  # ImageFolder's order: classes, then names

    class Jpegs:
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            return paths[i].read_bytes(), int(paths[i].parent.name[-1])

    spec = dict(transform="random_resized_crop(48) | hflip | normalize(imagenet)",
                batch_size=2, shuffle=True, seed=3, num_workers=2)
    direct = [(b["image"].copy(), b["label"].copy())
              for b in stoker.Loader(f"image_folder:{tmp_path}", **spec)]
    through = [(b["image"].copy(), b["label"].copy()) for b in stoker.Loader(Jpegs(), **spec)]
    assert len(direct) == len(through) == 2
    for (a, la), (b, lb) in zip(direct, through):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


class CallsInside:
    """Counts the `with` blocks in progress at once, and the most there were."""

    def __init__(self):
        import threading

        self.inside = 0
        self.most = 0
        self._lock = threading.Lock()

    def __enter__(self):
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)

    def __exit__(self, *exc):
        with self._lock:
            self.inside -= 1


def test_getitem_runs_one_call_at_a_time_so_a_lazily_opened_file_is_safe(tmp_path):
    """torch's worker processes each have their own copy of a dataset; a dataset written for
    them may open a file on first use and seek in it. stoker's worker threads share one object,
    so its calls take turns, even where they release the GIL (the file read, the sleep)."""
    import time

    path = tmp_path / "records.bin"
    np.arange(400, dtype=np.float32).repeat(16).tofile(path)

    class Records:
        def __init__(self):
            self.f = None
            self.calls = CallsInside()

        def __len__(self):
            return 400

        def __getitem__(self, i):
            with self.calls:
                if self.f is None:
                    self.f = open(path, "rb", buffering=0)
                self.f.seek(i * 64)
                time.sleep(0.0002)
                return np.frombuffer(self.f.read(64), np.float32).copy(), i

    dataset = Records()
    with stoker.Loader(dataset, batch_size=20, shuffle=True, seed=3, num_workers=4) as loader:
        for batch in loader:
            np.testing.assert_array_equal(batch["data"][:, 0], batch["label"])
    assert dataset.calls.most == 1
    dataset.f.close()


def test_scalars_batch_to_one_value_a_sample_as_in_torch():
    class Scalars:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"x": np.float32(i) / 2, "target": np.int64(i), "n": i}

    (batch,) = list(stoker.Loader(Scalars(), batch_size=6))
    assert [batch[k].shape for k in ("x", "target", "n")] == [(6,), (6,), (6,)]
    np.testing.assert_array_equal(batch["x"], np.arange(6, dtype=np.float32) / 2)


def test_a_failing_len_is_raised_not_taken_for_an_empty_dataset():
    class Broken:
        def __len__(self):
            raise RuntimeError("index file missing")

        def __getitem__(self, i):
            return np.zeros(1, np.float32)

    with pytest.raises(RuntimeError, match="index file missing"):
        stoker.Loader(Broken(), batch_size=2)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_ctrl_c_in_getitem_interrupts_the_loop(on_error):
    """With num_workers=0 `__getitem__` runs on the calling thread, inside the library's call:
    a KeyboardInterrupt there cannot pass through it, and used to come out as a CallbackError
    (or, under skip, be swallowed)."""

    class Interrupted:
        def __len__(self):
            return 40

        def __getitem__(self, i):
            if i == 13:
                raise KeyboardInterrupt
            return np.full(2, i, np.float32)

    loader = stoker.Loader(Interrupted(), batch_size=4, num_workers=0, on_error=on_error)
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    loader.close()


def test_concurrent_getitem_lets_a_thread_safe_dataset_overlap():
    """A dataset that declares itself safe to call from several threads has its calls overlap
    where they release the GIL; the batches are the same."""
    import time

    class Sleepy:
        def __init__(self):
            self.calls = CallsInside()

        def __len__(self):
            return 64

        def __getitem__(self, i):
            with self.calls:
                time.sleep(0.002)
                return np.full(3, i, np.float32), i

    batches = {}
    for concurrent in (False, True):
        dataset = Sleepy()
        with stoker.Loader(dataset, batch_size=8, num_workers=4,
                           concurrent_getitem=concurrent) as loader:
            batches[concurrent] = [b["label"].tolist() for b in loader]
        assert (dataset.calls.most > 1) == concurrent, dataset.calls.most
    assert batches[False] == batches[True]
    with pytest.raises(TypeError, match="map-style"):
        stoker.Loader(iter([]), concurrent_getitem=True)
