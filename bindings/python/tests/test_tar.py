"""WebDataset tar shards written by ``webdataset.TarWriter``: ``source="tar:PATTERN"`` in indexed
mode (``shuffle_buffer=0``) and streaming mode (``shuffle_buffer=N``), read like WebDataset reads
them; ranks get equal batch counts with uneven shards; raw-bytes fields; resume."""

import io
import json

import numpy as np
import pytest

import stoker

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

SIZES = [5, 9, 2, 7]  # uneven shards, 23 samples


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Shards of samples `i`: a 12x10 JPEG of colour (10 i, 5 i, 255 - 10 i), cls = i,
    json = {"id": i, "name": "x" * (i % 4)}. Returns (pattern, pixels by id)."""
    root = tmp_path_factory.mktemp("wds")
    pixels = {}
    i = 0
    for s, n in enumerate(SIZES):
        with wds.TarWriter(str(root / f"train-{s:03d}.tar")) as sink:
            for _ in range(n):
                colour = np.array([10 * i % 256, 5 * i % 256, 255 - 10 * i % 256], np.uint8)
                image = np.broadcast_to(colour, (10, 12, 3)).copy()
                buf = io.BytesIO()
                Image.fromarray(image).save(buf, format="JPEG", quality=95)
                pixels[i] = image
                sink.write(
                    {
                        "__key__": f"sample{i:05d}",
                        "jpg": buf.getvalue(),
                        "cls": i,
                        "json": {"id": i, "name": "x" * (i % 4)},
                    }
                )
                i += 1
    return f"tar:{root}/train-{{000..{len(SIZES) - 1:03d}}}.tar", pixels


def labels(loader):
    return [batch["label"].tolist() for batch in loader]


@pytest.mark.parametrize("shuffle_buffer", [0, 4])
def test_images_and_labels_as_webdataset_reads_them(shards, shuffle_buffer):
    pattern, pixels = shards
    # What webdataset itself reads from the shards.
    expected = sorted(
        int(s["cls"]) for s in wds.WebDataset(pattern[4:], shardshuffle=False).decode()
    )
    loader = stoker.Loader(
        pattern,
        batch_size=5,
        shuffle=True,
        shuffle_buffer=shuffle_buffer,
        transform="resize(10, 12)",
        dtype="uint8",
        layout="nhwc",
        num_workers=2,
    )
    assert len(loader) == 5
    seen = []
    for batch in loader:
        assert batch["image"].shape[1:] == (10, 12, 3)
        for image, label in zip(batch["image"], batch["label"]):
            # JPEG is lossy: the flat colour comes back within a few levels.
            assert np.abs(image.astype(int) - pixels[int(label)]).max() <= 4
            seen.append(int(label))
    assert sorted(seen) == expected == list(range(23))


@pytest.mark.parametrize("shuffle_buffer", [0, 3])
def test_raw_json_is_a_padded_bytes_field_with_lengths(shards, shuffle_buffer):
    pattern, _ = shards
    loader = stoker.Loader(
        pattern,
        batch_size=23,
        fields="cls:label,json:meta",
        shuffle_buffer=shuffle_buffer,
    )
    batch = next(iter(loader))
    assert list(batch) == ["label", "meta", "meta_lengths"]
    meta, lengths = batch["meta"], batch["meta_lengths"]
    assert meta.dtype == np.uint8
    for row, n, label in zip(meta, lengths, batch["label"]):
        assert not row[n:].any(), "padded with 0"
        record = json.loads(bytes(row[:n]))
        assert record == {"id": int(label), "name": "x" * (int(label) % 4)}


@pytest.mark.parametrize("shuffle_buffer", [0, 5])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_get_equal_batches_and_every_sample(shards, shuffle_buffer, world):
    pattern, _ = shards
    counts, seen = [], []
    for rank in range(world):
        loader = stoker.Loader(
            pattern,
            batch_size=3,
            fields="cls:label",
            shuffle=True,
            seed=4,
            shuffle_buffer=shuffle_buffer,
            rank=rank,
            world_size=world,
            num_workers=1,
        )
        batches = labels(loader)
        assert len(batches) == len(loader)
        counts.append(len(batches))
        seen += sum(batches, [])
    assert len(set(counts)) == 1
    per_rank = -(-23 // world)
    assert len(seen) == per_rank * world
    assert set(seen) == set(range(23))


def test_streaming_resume_mid_epoch(shards):
    pattern, _ = shards
    options = dict(batch_size=4, fields="cls:label", shuffle_buffer=6, seed=9, num_workers=2)
    whole = labels(stoker.Loader(pattern, **options))
    loader = stoker.Loader(pattern, **options)
    it = iter(loader)
    got = [next(it)["label"].tolist() for _ in range(2)]
    resumed = stoker.Loader(pattern, **options, resume_state=loader.state_dict()["state"])
    assert got + labels(resumed) == whole


def test_options_name_their_key(shards):
    pattern, _ = shards
    with pytest.raises(stoker.InvalidArgumentError, match="fields"):
        stoker.Loader(pattern, fields="jpg")
    with pytest.raises(stoker.InvalidArgumentError, match="shuffle_buffer"):
        stoker.Loader("npy:/nonexistent.npy", shuffle_buffer=4)
    with pytest.raises(stoker.StokerError, match="weights"):
        stoker.Loader(pattern, shuffle_buffer=4, weights=[1.0] * 23)
