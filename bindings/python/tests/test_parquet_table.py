"""``parquet:`` tables: image datasets laid out as the Hugging Face Hub ships them (an ``image``
column of ``struct<bytes: binary, path: string>`` and an int64 ``label``, the ``huggingface``
schema metadata), written by pyarrow. Images decode as Pillow decodes them, numbers keep their
values, ``columns`` picks and names fields, a null image fails only its sample, and
``stoker pack`` keeps the table."""

import glob
import io
import json
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import stoker
from test_parquet import stoker_command

ROWS = [9, 6, 5]  # three files, 20 rows
H, W = 10, 12

HF_FEATURES = {
    "info": {
        "features": {
            "image": {"_type": "Image"},
            "label": {"dtype": "int64", "_type": "ClassLabel", "names": [str(c) for c in range(7)]},
            "score": {"dtype": "float64", "_type": "Value"},
            "caption": {"dtype": "string", "_type": "Value"},
        }
    }
}


def image_of(i):
    """Row i's pixels: smooth gradients that PNG keeps exactly."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([(x * 20 + i) % 256, (y * 25 + 3 * i) % 256, (x + y + 7 * i) % 256], -1).astype(
        np.uint8
    )


def png(pixels):
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Three files (snappy with row groups of 4, zstd, and large_binary images); returns the
    ``parquet:`` pattern and every row's (pixels, label, score)."""
    root = tmp_path_factory.mktemp("hf")
    rows = []
    start = 0
    for f, n in enumerate(ROWS):
        ids = range(start, start + n)
        start += n
        images = [{"bytes": png(image_of(i)), "path": f"{i}.png"} for i in ids]
        binary = pa.large_binary() if f == 2 else pa.binary()
        image_type = pa.struct([("bytes", binary), ("path", pa.string())])
        t = pa.table(
            {
                "image": pa.array(images, type=image_type),
                "label": pa.array([i % 7 for i in ids], type=pa.int64()),
                "score": pa.array([i / 4 - 1 for i in ids], type=pa.float64()),
                "caption": [f"row {i}" for i in ids],
            }
        ).replace_schema_metadata({"huggingface": json.dumps(HF_FEATURES)})
        pq.write_table(
            t,
            root / f"train-{f:05d}-of-{len(ROWS):05d}.parquet",
            row_group_size=4,
            compression="zstd" if f == 1 else "snappy",
        )
        rows += [(image_of(i), i % 7, i / 4 - 1) for i in ids]
    return f"parquet:{root}/train-*.parquet", rows


def every_row(loader):
    """(pixels, label) of every sample of an epoch, by score (one per row)."""
    got = {}
    for batch in loader:
        assert sorted(batch) == ["image", "label", "score"], "text columns are not fields"
        assert batch["label"].dtype == np.int64 and batch["score"].dtype == np.float32
        for image, label, score in zip(batch["image"], batch["label"], batch["score"]):
            got[float(score)] = (np.array(image), int(label))
    return got


@pytest.mark.parametrize("workers", [0, 2])
def test_images_decode_as_pillow_does_and_numbers_keep_their_values(table, workers):
    pattern, rows = table
    loader = stoker.Loader(
        pattern,
        batch_size=6,
        shuffle=True,
        transform=f"resize({H}, {W})",
        dtype="uint8",
        layout="nhwc",
        num_workers=workers,
    )
    assert len(loader) == -(-len(rows) // 6), "the last batch is partial"
    got = every_row(loader)
    assert len(got) == len(rows)
    for pixels, label, score in rows:
        image, got_label = got[float(np.float32(score))]
        assert got_label == label
        np.testing.assert_array_equal(image, pixels)


def test_the_numbers_equal_what_pyarrow_reads(table):
    pattern, _ = table
    files = sorted(glob.glob(pattern[len("parquet:") :]))
    expected = pa.concat_tables([pq.read_table(f, columns=["label", "score"]) for f in files])
    loader = stoker.Loader(pattern, columns="label, score:value", batch_size=20)
    (batch,) = list(loader)
    np.testing.assert_array_equal(batch["label"], expected["label"].to_numpy())
    np.testing.assert_array_equal(
        batch["value"], expected["score"].to_numpy().astype(np.float32)
    )


def test_columns_pick_and_name_fields_and_bad_ones_are_named(table):
    pattern, _ = table
    loader = stoker.Loader(
        pattern, columns="image:img,label:y", batch_size=4, transform="resize(8)|center_crop(8)"
    )
    batch = next(iter(loader))
    assert sorted(batch) == ["img", "y"]
    assert batch["img"].shape == (4, 3, 8, 8)
    with pytest.raises(stoker.StokerError, match=r"no column `picture`.*image, label, score"):
        stoker.Loader(pattern, columns="picture")
    with pytest.raises(stoker.StokerError, match="holds text"):
        stoker.Loader(pattern, columns="caption")
    with pytest.raises(stoker.StokerError, match="tokenizer"):
        stoker.Loader(pattern, seq_len=8)


def test_a_null_image_fails_its_own_sample_only(tmp_path):
    images = [{"bytes": png(image_of(i)), "path": None} for i in range(6)]
    images[2] = {"bytes": None, "path": "elsewhere.png"}
    pq.write_table(
        pa.table({"image": images, "label": list(range(6))}), tmp_path / "t.parquet"
    )
    source = f"parquet:{tmp_path}/t.parquet"
    options = dict(batch_size=3, transform=f"resize({H}, {W})")
    with stoker.Loader(source, **options) as loader:
        with pytest.raises(stoker.StokerError, match=r"t\.parquet row 2.*`image`.*null"):
            list(loader)
    with stoker.Loader(source, on_error="skip", **options) as loader:
        assert sum(len(b["label"]) for b in loader) == 6
        assert loader.stats().samples_skipped == 1


def test_stoker_pack_keeps_the_table(table, tmp_path):
    pattern, _ = table
    out = tmp_path / "packed"
    run = subprocess.run(
        [stoker_command(), "pack", pattern, str(out)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    options = dict(batch_size=5, transform=f"resize({H}, {W})", dtype="uint8", layout="nhwc")
    packed = every_row(stoker.Loader(f"packed:{out}", **options))
    direct = every_row(stoker.Loader(pattern, **options))
    assert packed.keys() == direct.keys()
    for k in direct:
        np.testing.assert_array_equal(packed[k][0], direct[k][0])
        assert packed[k][1] == direct[k][1]
