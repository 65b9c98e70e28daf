"""stoker's packed format from Python: ``stoker.pack`` of an image folder (kept JPEGs, shrunk
JPEGs, raw pixels), read back with ``packed:PATH`` into the batches the folder gives; slices
packed separately and merged; bad arguments and a damaged file."""

import io

import numpy as np
import pytest

import stoker

Image = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Two classes of 7 JPEGs each, of varying sizes."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(3)
    for c in ("cat", "dog"):
        (root / c).mkdir()
        for i in range(7):
            h, w = 40 + 9 * i, 60 + 5 * i
            base = rng.integers(0, 256, size=(h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
            image = np.kron(base, np.ones((8, 8, 1), np.uint8))[:h, :w]
            buf = io.BytesIO()
            Image.fromarray(image).save(buf, format="JPEG", quality=92)
            (root / c / f"{i}.jpg").write_bytes(buf.getvalue())
    return root


OPTIONS = dict(
    batch_size=5,
    shuffle=True,
    seed=4,
    num_workers=2,
    transform="random_resized_crop(24) | hflip | normalize(imagenet)",
)


def epoch(source, **extra):
    with stoker.Loader(source, **OPTIONS, **extra) as loader:
        return [(b["image"].copy(), b["label"].copy()) for b in loader]


def same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def test_packed_images_give_the_folders_batches(folder, tmp_path):
    want = epoch(f"image_folder:{folder}")
    stoker.pack(f"image_folder:{folder}", tmp_path / "kept.stkpack")
    same(epoch(f"packed:{tmp_path / 'kept.stkpack'}"), want)
    stoker.pack(f"image_folder:{folder}", str(tmp_path / "raw.stkpack"), mode="raw")
    same(epoch(f"packed:{tmp_path / 'raw.stkpack'}"), want)
    # Shrunk images are smaller files and still deliver the pipeline's shape.
    stoker.pack(f"image_folder:{folder}", tmp_path / "small.stkpack", max_side=32, quality=80)
    assert (tmp_path / "small.stkpack").stat().st_size < (tmp_path / "kept.stkpack").stat().st_size
    small = epoch(f"packed:{tmp_path / 'small.stkpack'}", order="quasi_random")
    assert sorted(int(y) for _, ys in small for y in ys) == sorted(
        int(y) for _, ys in want for y in ys
    )
    assert small[0][0].shape == (5, 3, 24, 24)


def test_slices_merge_into_the_same_dataset(folder, tmp_path):
    src = f"image_folder:{folder}"
    stoker.pack(src, tmp_path / "one.stkpack", mode="smart", max_side=48)
    for i in range(3):
        stoker.pack(src, tmp_path / "sliced", mode="smart", max_side=48, shard_index=i, num_shards=3)
    with pytest.raises(stoker.StokerIOError, match="--merge"):
        stoker.Loader(f"packed:{tmp_path / 'sliced'}", **OPTIONS)
    stoker.pack_merge(tmp_path / "sliced")
    same(epoch(f"packed:{tmp_path / 'sliced'}"), epoch(f"packed:{tmp_path / 'one.stkpack'}"))
    # Two slices, twice: the same bytes.
    stoker.pack(src, tmp_path / "again.stkpack", mode="smart", max_side=48)
    assert (tmp_path / "again.stkpack").read_bytes() == (tmp_path / "one.stkpack").read_bytes()


def test_bad_arguments_and_a_damaged_file(folder, tmp_path):
    src = f"image_folder:{folder}"
    with pytest.raises(stoker.InvalidArgumentError, match="webp"):
        stoker.pack(src, tmp_path / "x.stkpack", mode="webp")  # type: ignore[arg-type]
    # The library's own wording, as from C, C++ and the command line.
    with pytest.raises(stoker.InvalidArgumentError, match="`quality`: 0 is not between 1 and 100"):
        stoker.pack(src, tmp_path / "x.stkpack", quality=0)
    with pytest.raises(stoker.InvalidArgumentError, match="shard index 3 is out of range for 2"):
        stoker.pack(src, tmp_path / "x", shard_index=3, num_shards=2)
    with pytest.raises(ValueError, match="quality -1 is negative"):
        stoker.pack(src, tmp_path / "x.stkpack", quality=-1)
    with pytest.raises(ValueError, match="go together"):
        stoker.pack(src, tmp_path / "x", shard_index=1)
    with pytest.raises(stoker.StokerIOError, match="missing"):
        stoker.pack("image_folder:/nonexistent/missing", tmp_path / "x.stkpack")
    out = tmp_path / "d.stkpack"
    stoker.pack(src, out)
    data = bytearray(out.read_bytes())
    data[-3] ^= 0xFF  # inside the metadata table
    out.write_bytes(bytes(data))
    with pytest.raises(stoker.DecodeError, match="checksum mismatch"):
        stoker.Loader(f"packed:{out}", **OPTIONS)
