"""A Python iterable dataset (``__iter__`` and no ``__len__``) as the source: the stream each rank
opens (``stoker.stream_info()``), the equal-batches rule, determinism, resume, failures."""

import gc
import weakref

import numpy as np
import pytest

import stoker


class Ids:
    """Rank r of w streams ids r, r + w, ... below n (rank 0 stops `short` early), as
    {"x": [id, -id], "label": id}; records the stream info of every ``__iter__``."""

    def __init__(self, n=23, short=0, bad=None):
        self.n, self.short, self.bad = n, short, bad
        self.opened = []

    def __iter__(self):
        info = stoker.stream_info()
        self.opened.append(info)
        ids = list(range(info.rank, self.n, info.world_size))
        if info.rank == 0 and self.short:
            ids = ids[: -self.short]
        return self._generate(ids)

    def _generate(self, ids):
        for i in ids:
            # stream_info() also holds while the generator runs.
            assert stoker.stream_info() is not None
            if i == self.bad:
                raise ValueError(f"id {i} is unlucky")
            yield {"x": np.array([i, -i], np.int64), "label": i}


def ids_of(loader):
    out = []
    for batch in loader:
        np.testing.assert_array_equal(batch["x"][:, 0], batch["label"])
        out.append(batch["label"].tolist())
    return out


def test_a_rank_reads_its_stream_in_order_and_length_is_unknown():
    ds = Ids()
    loader = stoker.Loader(ds, batch_size=4, num_workers=2, seed=5)
    assert loader.batches_per_epoch is None
    with pytest.raises(TypeError, match="num_samples"):
        len(loader)
    first = ids_of(loader)
    assert sum(first, []) == list(range(23))
    assert ids_of(loader) == first
    loader.close()
    assert ds.opened[0] == stoker.StreamInfo(
        rank=0, world_size=1, worker=0, num_workers=1, seed=5, epoch=0
    )
    assert ds.opened[1].epoch == 1
    assert stoker.stream_info() is None


@pytest.mark.parametrize("world", [1, 2, 3])
def test_num_samples_gives_every_rank_the_same_batch_count(world):
    counts, seen = [], []
    for rank in range(world):
        loader = stoker.Loader(
            Ids(n=31, short=3),
            batch_size=4,
            num_workers=1,
            num_samples=31,
            shuffle_buffer=6,
            rank=rank,
            world_size=world,
        )
        batches = ids_of(loader)
        assert len(batches) == len(loader)
        counts.append(len(batches))
        flat = sum(batches, [])
        assert len(flat) == -(-31 // world)
        assert all(i % world == rank for i in flat)
        seen += flat
    assert len(set(counts)) == 1
    # Rank 0's stream is short: it wrapped around; everything else appears.
    assert set(seen) >= set(range(31)) - set(range(0, 31, world)[-3:])


def test_same_batches_whatever_num_workers_with_a_shuffle_buffer():
    def run(workers):
        loader = stoker.Loader(Ids(n=50), batch_size=6, num_workers=workers, shuffle_buffer=10, seed=3)
        return [ids_of(loader) for _ in range(2)]

    reference = run(0)
    assert sum(reference[0], []) != list(range(50))
    assert reference[0] != reference[1]
    assert run(2) == reference


def test_resume_mid_epoch_replays_the_stream():
    loader = stoker.Loader(Ids(n=40), batch_size=3, shuffle_buffer=5, num_workers=2, seed=8)
    whole = ids_of(loader)
    loader = stoker.Loader(Ids(n=40), batch_size=3, shuffle_buffer=5, num_workers=2, seed=8)
    it = iter(loader)
    got = [next(it)["label"].tolist() for _ in range(4)]
    state = loader.state_dict()
    resumed = stoker.Loader(Ids(n=40), batch_size=3, shuffle_buffer=5, num_workers=2, seed=8)
    resumed.load_state_dict(state)
    assert got + ids_of(resumed) == whole


def test_an_exception_in_the_iterator_fails_its_sample_or_is_replaced():
    loader = stoker.Loader(Ids(n=12, bad=5), batch_size=4, num_workers=1)
    with pytest.raises(stoker.CallbackError, match="id 5 is unlucky"):
        for _ in loader:
            pass
    skip = stoker.Loader(Ids(n=12, bad=5), batch_size=4, num_workers=1, on_error="skip")
    flat = sum(ids_of(skip), [])
    # The generator ends at the exception: samples 0..4 and a replacement for 5.
    assert len(flat) == 6 and 5 not in flat
    assert skip.stats().samples_skipped == 1


def test_an_exception_in_iter_fails_the_loader():
    class Broken:
        def __iter__(self):
            raise RuntimeError("no stream today")

    with pytest.raises(stoker.CallbackError, match="no stream today"):
        stoker.Loader(Broken(), batch_size=2)


def test_encoded_images_from_a_stream():
    Image = pytest.importorskip("PIL.Image")
    import io

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    png = buf.getvalue()

    class Pictures:
        def __iter__(self):
            return iter([(png, i % 3) for i in range(7)])

    loader = stoker.Loader(Pictures(), batch_size=7, transform="resize(8, 8)", dtype="uint8")
    batch = next(iter(loader))
    assert batch["image"].shape == (7, 3, 8, 8)
    assert batch["label"].tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_the_iterable_is_released_with_the_loader():
    ds = Ids()
    ref = weakref.ref(ds)
    loader = stoker.Loader(ds, batch_size=4, num_workers=2)
    next(iter(loader))
    del ds, loader
    gc.collect()
    assert ref() is None
