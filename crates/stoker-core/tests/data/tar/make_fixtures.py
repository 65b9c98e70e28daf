"""Writes the WebDataset shards the tar tests read, with Python's own `webdataset.TarWriter`.

    python3 -m venv /tmp/wds && /tmp/wds/bin/pip install webdataset numpy pillow
    /tmp/wds/bin/python crates/stoker-core/tests/data/tar/make_fixtures.py

Outputs, beside this script (committed; a few KB each):
- `wds-000000.tar` (5 samples) and `wds-000001.tar` (3 samples): members `jpg` (or `png`, or an
  upper-case `JPG`), `cls` (an int label), `txt` (a caption), `npy` (a float32 [3] array). Shard 1
  has a key inside a directory and a key longer than 100 characters (pax long name: Python's
  tarfile writes the pax format by default).
- `wds-000000.tar.gz`: shard 0 again, gzip-compressed by TarWriter.
- `members/wds-00000N/`: every member of shard N extracted as a file, the exact bytes the
  shard holds, from which the tests build the same shard with GNU tar.

The tests (`tests/tar_source.rs`) know the keys, labels, captions and arrays written here.
"""

import io
import os
import shutil
import tarfile

import numpy as np
import webdataset as wds
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
LABELS = [3, 1, 4, 1, 5, 9, 2, 6]
LONG_KEY = "long_" + "k" * 100 + "_s0006"


def image(i, fmt):
    """A small deterministic gradient image, encoded as `fmt`."""
    w, h = 20 + 2 * i, 12 + i
    pixels = bytes(
        v
        for y in range(h)
        for x in range(w)
        for v in ((x * 255) // w, (y * 255) // h, (i * 37) % 256)
    )
    img = Image.frombytes("RGB", (w, h), pixels)
    out = io.BytesIO()
    if fmt == "jpeg":
        img.save(out, format="JPEG", quality=75)
    else:
        img.save(out, format="PNG")
    return out.getvalue()


def sample(i):
    key = {5: "part/s0005", 6: LONG_KEY}.get(i, f"s{i:04d}")
    image_ext = {3: "png", 7: "JPG"}.get(i, "jpg")
    return {
        "__key__": key,
        image_ext: image(i, "png" if image_ext == "png" else "jpeg"),
        "cls": LABELS[i],
        "txt": f"caption of sample {i}",
        "npy": np.array([i, i + 0.5, -i], dtype=np.float32),
    }


def main():
    shards = {"wds-000000": range(0, 5), "wds-000001": range(5, 8)}
    for name, ids in shards.items():
        path = os.path.join(HERE, name + ".tar")
        with wds.TarWriter(path, mtime=1700000000) as writer:
            for i in ids:
                writer.write(sample(i))
        members = os.path.join(HERE, "members", name)
        shutil.rmtree(members, ignore_errors=True)
        with tarfile.open(path) as tar:
            tar.extractall(members, filter="data")
    with wds.TarWriter(os.path.join(HERE, "wds-000000.tar.gz"), mtime=1700000000) as writer:
        for i in shards["wds-000000"]:
            writer.write(sample(i))


if __name__ == "__main__":
    main()
