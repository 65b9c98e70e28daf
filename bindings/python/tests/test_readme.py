"""The Python examples of the READMEs and of the book, run as written.

Each ```python block of README.md, bindings/python/README.md and docs/*.md runs in a fresh
namespace; only what a reader substitutes anyway is replaced: the dataset path by a small folder
of real JPEG files (a ``segmentation_folder:`` path by a folder of JPEGs and PNG masks, and the
detection shards ``tar:/data/det-...`` by one shard of JPEGs with their boxes, a ``coco:`` or
``coco_masks:`` annotation file by their COCO instances, ``parquet:/data/hf/...`` by a table of
those JPEGs and ``parquet:`` text by test_parquet's), the epoch count by
2, and the variables a fragment takes from the reader's program (``stoker`` itself, ``docs``,
``labels``) are provided.

The book's complete C programs (a ```c block with a ``main``) are compiled against
include/stoker.h and the library this package loads, and run on the same data."""

import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from _optional import import_torch
from PIL import Image

import stoker

REPO = Path(__file__).resolve().parents[3]
# docs/porting.md's blocks are side-by-side torch and stoker programs that build on each other
# within a section: test_porting.py runs them, section by section, with torchvision's datasets.
OWN_RUNNER = {REPO / "docs" / "porting.md"}
READMES = [
    REPO / "README.md",
    REPO / "bindings" / "python" / "README.md",
    *sorted(set((REPO / "docs").glob("*.md")) - OWN_RUNNER),
]


def python_blocks():
    for readme in READMES:
        text = readme.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```$", text, re.M | re.S):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(m.group(1), id=f"{readme.relative_to(REPO)}:{line}")


@pytest.fixture
def image_folder(tmp_path):
    """ROOT/{cat,dog}/k.jpg: photo-like JPEGs of an ImageNet-ish aspect, 40 per class."""
    rng = np.random.default_rng(5)
    y, x = np.mgrid[0:75, 0:100]
    for c, cls in enumerate(("cat", "dog")):
        (tmp_path / cls).mkdir()
        for k in range(40):
            rgb = np.stack([np.sin(x / (4 + k % 5) + c), np.cos(y / 7 + k), x / 100], -1)
            rgb = (rgb - rgb.min()) / np.ptp(rgb) * 220 + rng.uniform(0, 30, rgb.shape)
            Image.fromarray(rgb.astype(np.uint8)).save(tmp_path / cls / f"{k}.jpg", quality=90)
    return tmp_path


@pytest.fixture(scope="module")
def dense_data(tmp_path_factory):
    """(segmentation folder, detection shard, COCO annotations): 12 photo-like 100x75 JPEGs, each
    with a PNG mask of two rectangles of classes 1..20 and the rectangles' boxes (xywh) and
    classes in a json member beside the JPEG in the shard, and as COCO instances (polygons)."""
    root = tmp_path_factory.mktemp("dense")
    rng = np.random.default_rng(6)
    y, x = np.mgrid[0:75, 0:100]
    for sub in ("images", "masks"):
        (root / "seg" / sub).mkdir(parents=True)
    shard = root / "det-000000.tar"
    coco = {"images": [], "annotations": [],
            "categories": [{"id": c, "name": f"class {c}"} for c in range(1, 21)]}
    with tarfile.open(shard, "w") as tar:
        for k in range(12):
            rgb = np.stack([np.sin(x / (4 + k % 5)), np.cos(y / 7 + k), x / 100], -1)
            rgb = (rgb - rgb.min()) / np.ptp(rgb) * 220 + rng.uniform(0, 30, rgb.shape)
            mask = np.zeros((75, 100), np.uint8)
            boxes, classes = [], []
            for _ in range(2):
                x0, y0 = int(rng.integers(0, 70)), int(rng.integers(0, 50))
                w, h = int(rng.integers(8, 30)), int(rng.integers(8, 25))
                c = int(rng.integers(1, 21))
                mask[y0:y0 + h, x0:x0 + w] = c
                boxes.append([x0, y0, w, h])
                classes.append(c)
            members = {}
            for ext, image, fmt in (("jpg", Image.fromarray(rgb.astype(np.uint8)), "JPEG"),
                                    ("png", Image.fromarray(mask), "PNG")):
                b = io.BytesIO()
                image.save(b, fmt)
                members[ext] = b.getvalue()
            members["json"] = json.dumps({"boxes": boxes, "labels": classes}).encode()
            (root / "seg" / "images" / f"{k:03d}.jpg").write_bytes(members["jpg"])
            (root / "seg" / "masks" / f"{k:03d}.png").write_bytes(members["png"])
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{k:03d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            (root / "coco" / "train").mkdir(parents=True, exist_ok=True)
            (root / "coco" / "train" / f"{k:03d}.jpg").write_bytes(members["jpg"])
            coco["images"].append({"id": k, "file_name": f"{k:03d}.jpg", "width": 100, "height": 75})
            for (bx, by, bw, bh), c in zip(boxes, classes):
                polygon = [bx, by, bx + bw, by, bx + bw, by + bh, bx, by + bh]
                coco["annotations"].append({
                    "id": len(coco["annotations"]) + 1, "image_id": k, "category_id": c,
                    "bbox": [bx, by, bw, bh], "area": bw * bh, "iscrowd": 0,
                    "segmentation": [polygon]})
    (root / "coco" / "annotations").mkdir()
    annotations = root / "coco" / "annotations" / "instances_train.json"
    annotations.write_text(json.dumps(coco))
    return root / "seg", shard, annotations


@pytest.fixture
def text_parquet(tmp_path_factory):
    """Parquet files of text and a tokenizer.json, for `parquet:` examples (test_parquet's)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from test_parquet import TEXTS, write_tokenizer

    root = tmp_path_factory.mktemp("parquet")
    pq.write_table(pa.table({"text": TEXTS * 100}), root / "train-0.parquet", row_group_size=100)
    return root / "train-*.parquet", write_tokenizer(root / "tokenizer.json")


@pytest.fixture
def image_parquet(dense_data, tmp_path_factory):
    """A Hugging Face-style image table (`img` as struct<bytes, path>, an int64 `label`) of the
    dense data's JPEGs, for `parquet:` table examples."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("hf")
    files = sorted((dense_data[0] / "images").glob("*.jpg"))
    images = [{"bytes": f.read_bytes(), "path": f.name} for f in files]
    pq.write_table(pa.table({"img": images, "label": [k % 10 for k in range(len(files))]}),
                   root / "train-00000-of-00001.parquet", row_group_size=5)
    return root / "train-*.parquet"


def test_the_readmes_have_python_examples():
    names = {p.id.split(":")[0] for p in python_blocks()}
    # The quickstart, the package's page and the book's chapters with Python examples.
    assert {"README.md", "bindings/python/README.md", "docs/sources.md"} <= names


@pytest.mark.parametrize("code", list(python_blocks()))
def test_readme_python_example_runs(
    code, image_folder, dense_data, text_parquet, image_parquet, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # what an example writes lands here
    if "batch.torch()" in code or ".torch()" in code:
        import_torch()
    code = re.sub(r'"image_folder:[^"]*"', f'"image_folder:{image_folder}"', code)
    code = re.sub(r'"segmentation_folder:[^"]*"', f'"segmentation_folder:{dense_data[0]}"', code)
    code = re.sub(r'"tar:/data/det-[^"]*"', f'"tar:{dense_data[1]}"', code)
    code = re.sub(r'"coco(_masks)?:[^"]*"', lambda m: f'"coco{m.group(1) or ""}:{dense_data[2]}"', code)
    code = re.sub(
        r'"parquet:([^"]*)"',
        lambda m: f'"parquet:{image_parquet if m.group(1).startswith("/data/hf/") else text_parquet[0]}"',
        code,
    )
    code = re.sub(r'tokenizer="[^"]*"', f'tokenizer="{text_parquet[1]}"', code)
    code = re.sub(r"eos_token=\d+", "eos_token=1", code)
    code = re.sub(r"range\(\d+\)", "range(2)", code)
    rng = np.random.default_rng(0)
    namespace = {
        "stoker": stoker,
        "docs": [rng.integers(0, 30000, int(n), dtype=np.int32) for n in rng.integers(5, 40, 100)],
        "labels": rng.integers(0, 10, 100),
    }
    exec(compile(code, "<README example>", "exec"), namespace)
    if "loader" in namespace:
        loader = namespace["loader"]
        batch = loader.next_batch() or loader.next_batch()  # the next epoch, if this one ended
        assert batch is not None and len(batch) >= 2
        loader.close()


def c_programs():
    for page in sorted((REPO / "docs").glob("*.md")):
        text = page.read_text()
        for m in re.finditer(r"^```c\n(.*?)^```$", text, re.M | re.S):
            if re.search(r"^int main\(", m.group(1), re.M):
                line = text.count("\n", 0, m.start()) + 1
                yield pytest.param(m.group(1), id=f"{page.relative_to(REPO)}:{line}")


def test_the_book_has_complete_c_programs():
    assert any("transforms.md" in p.id for p in c_programs()), (
        "docs/transforms.md's segmentation and detection section lost its complete C program"
    )


@pytest.mark.parametrize("code", list(c_programs()))
def test_book_c_program_compiles_and_runs(code, dense_data, tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH")
    # The library this package loads, under its own name and its soname (libstoker.so.0), which
    # the program asks the dynamic loader for.
    library = Path(stoker.LIBRARY_PATH).resolve()
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libstoker.so").symlink_to(library)
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True).stdout
    soname = re.search(r"\(SONAME\).*\[(.+?)\]", dynamic)
    if soname and soname.group(1) != "libstoker.so":
        (lib / soname.group(1)).symlink_to(library)
    (tmp_path / "example.c").write_text(code)
    exe = tmp_path / "example"
    build = subprocess.run(
        [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-I", str(REPO / "include"),
         str(tmp_path / "example.c"), "-o", str(exe), f"-L{lib}", "-lstoker", f"-Wl,-rpath,{lib}"],
        capture_output=True, text=True)
    assert build.returncode == 0, f"the book's C program does not compile:\n{build.stderr}"
    run = subprocess.run([str(exe), str(dense_data[0]), str(dense_data[1])],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"the book's C program failed:\n{run.stdout}\n{run.stderr}"
    assert "segmentation: 4 images" in run.stdout and " box 0: class " in run.stdout, run.stdout
