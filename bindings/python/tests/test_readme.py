"""The Python examples of the READMEs and of the book, run as written.

Each ```python block of README.md, bindings/python/README.md and docs/*.md runs in a fresh
namespace; only what a reader substitutes anyway is replaced: the dataset path by a small folder
of real JPEG files, the epoch count by 2, and the variables a fragment takes from the reader's
program (``stoker`` itself, ``docs``, ``labels``) are provided."""

import re
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


def test_the_readmes_have_python_examples():
    names = {p.id.split(":")[0] for p in python_blocks()}
    # The quickstart, the package's page and the book's chapters with Python examples.
    assert {"README.md", "bindings/python/README.md", "docs/sources.md"} <= names


@pytest.mark.parametrize("code", list(python_blocks()))
def test_readme_python_example_runs(code, image_folder, capsys):
    if "batch.torch()" in code:
        import_torch()
    code = re.sub(r'"image_folder:[^"]*"', f'"image_folder:{image_folder}"', code)
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
