"""Porting from torch in one line: a PyTorch user's own dataset objects handed to stoker.

Decoded images (PIL images, uint8 arrays) of varying size go through a transform that fixes the
output size, each from its own size; a torchvision ImageFolder without Python transforms is read
natively (``image_folder:ROOT``), with torchvision's samples, labels and order."""

import importlib
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from _optional import import_torch, required
from PIL import Image

import stoker
from stoker.transform import transform_image

SPEC = "random_resized_crop(16) | hflip"
SEED = 11
SIZES = [(30, 41), (52, 25), (33, 33), (20, 64), (47, 39)]


def picture(i: int) -> np.ndarray:
    """Sample ``i``: a uint8 ``[H, W, 3]`` image of size ``SIZES[i % 5]``, distinct per sample."""
    h, w = SIZES[i % len(SIZES)]
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def expected(i: int, image: np.ndarray, spec: str = SPEC, size: int = 16) -> np.ndarray:
    """What the loader's transform makes of ``image`` as sample ``i`` of epoch 0, ``[3, S, S]``."""
    out, _ = transform_image(spec, image, (size, size), seed=SEED, index=i)
    return out.transpose(2, 0, 1)


class Pictures:
    """A map-style dataset of ``(image, label)`` pairs, images of varying size as ``kind``."""

    def __init__(self, n: int, kind: str):
        self.n, self.kind = n, kind

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        image = picture(i)
        if self.kind == "chw":
            image = np.ascontiguousarray(image.transpose(2, 0, 1))
        elif self.kind == "pil":
            image = Image.fromarray(image)
        return image, i * 10


def first_epoch(loader) -> list:
    return [{k: np.array(v) for k, v in batch.items()} for batch in loader]


@pytest.mark.parametrize(
    "kind,options", [("hwc", {}), ("chw", {}), ("chw", {"input_layout": "chw"}), ("pil", {})]
)
def test_decoded_images_of_varying_size_are_transformed_each_from_its_size(kind, options):
    n = 12
    with stoker.Loader(
        Pictures(n, kind), batch_size=4, transform=SPEC, seed=SEED, num_workers=2, **options
    ) as loader:
        batches = first_epoch(loader)
    field = "image" if kind == "pil" else "data"
    assert [sorted(b) for b in batches] == [sorted([field, "label"])] * 3
    images = np.concatenate([b[field] for b in batches])
    labels = np.concatenate([b["label"] for b in batches])
    assert images.shape == (n, 3, 16, 16) and images.dtype == np.uint8
    np.testing.assert_array_equal(labels, np.arange(n) * 10)
    for i in range(n):
        np.testing.assert_array_equal(images[i], expected(i, picture(i)), err_msg=f"sample {i}")


class PictureStream:
    """An iterable dataset (``__iter__``, no ``__len__``) of PIL images of varying size."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        return ((Image.fromarray(picture(i)), i) for i in range(self.n))


def test_an_iterable_source_may_give_images_of_varying_size_too():
    with stoker.Loader(PictureStream(8), batch_size=4, transform="resize(8, 8)") as loader:
        batches = first_epoch(loader)
    images = np.concatenate([b["image"] for b in batches])
    assert np.concatenate([b["label"] for b in batches]).tolist() == list(range(8))
    for i in range(8):
        np.testing.assert_array_equal(images[i], expected(i, picture(i), "resize(8, 8)", 8))


def test_pil_images_of_other_modes_are_converted_to_rgb():
    gray = np.random.default_rng(3).integers(0, 256, (40, 30), dtype=np.uint8)
    dataset = [(Image.fromarray(gray, "L"), 0), (Image.fromarray(picture(1)).convert("RGBA"), 1)]
    spec = "resize(8, 8)"
    with stoker.Loader(dataset, batch_size=2, transform=spec, seed=SEED) as loader:
        batch = first_epoch(loader)[0]
    rgb_gray = np.asarray(Image.fromarray(gray, "L").convert("RGB"))
    np.testing.assert_array_equal(batch["image"][0], expected(0, rgb_gray, spec, 8))
    np.testing.assert_array_equal(batch["image"][1], expected(1, picture(1), spec, 8))


@pytest.mark.parametrize("layout", [None, "nchw", "nhwc"])
def test_layout_alone_arranges_pixel_images_of_one_size(layout):
    """Without image options, pixels come as the dataset gave them; ``layout`` said outright
    arranges them, as it does decoded images."""
    dataset = [(picture(0), i) for i in range(4)]
    with stoker.Loader(dataset, batch_size=4, layout=layout) as loader:
        images = first_epoch(loader)[0]["data"]
    hwc = np.stack([picture(0)] * 4)
    np.testing.assert_array_equal(images, hwc.transpose(0, 3, 1, 2) if layout == "nchw" else hwc)


@pytest.mark.parametrize("transform", [None, "hflip"])
def test_varying_sizes_without_a_sizing_transform_say_which_op_fixes_it(transform):
    with stoker.Loader(Pictures(6, "pil"), batch_size=3, transform=transform) as loader:
        with pytest.raises(stoker.StokerError) as e:
            first_epoch(loader)
    message = str(e.value)
    assert "sample 1" in message and "field `image` is uint8 [52, 25, 3]" in message, message
    assert "random_resized_crop(S)" in message, message


# ---- torchvision datasets -------------------------------------------------------------------


@pytest.fixture
def photo_folder(tmp_path):
    """ROOT/<class>/...: JPEGs and PNGs of varying size in three classes, one with a nested
    folder and upper-case extensions, so that order and labels have something to get wrong."""
    files = [
        "bird/b.jpg", "bird/a.png", "bird/z/c.JPG", "bird/z-y/d.jpeg",
        "cat/0.jpg", "cat/10.jpg", "cat/9.jpg",
        "dog/x.png", "dog/y.JPEG",
    ]  # fmt: skip
    for i, name in enumerate(files):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(picture(i)).save(path, quality=95)
    return tmp_path


def torchvision_datasets():
    """``torchvision.datasets``, or a skip where torch is optional (the test command installs
    torchvision beside torch, so there its absence fails)."""
    import_torch()
    if required():
        return importlib.import_module("torchvision.datasets")
    return pytest.importorskip("torchvision.datasets")


def test_image_folder_without_transform_is_read_natively_with_torchvisions_samples(
    photo_folder, caplog
):
    datasets = torchvision_datasets()
    from stoker.torch import DataLoader

    dataset = datasets.ImageFolder(str(photo_folder))
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        loader = DataLoader(dataset, batch_size=3, transform="resize(8, 8)")
    assert any("read natively as image_folder:" in r.getMessage() for r in caplog.records)
    assert loader.loader.options["source"] == f"image_folder:{photo_folder}"
    batches = list(loader)
    images = np.concatenate([np.asarray(x) for x, _ in batches])
    labels = np.concatenate([np.asarray(y) for _, y in batches]).tolist()
    assert labels == [target for _, target in dataset.samples]
    # Sample i is the file torchvision lists i-th, resized (JPEG decoders may round an IDCT
    # apart by a level or two; another file would be a different noise image altogether).
    for i, (path, _) in enumerate(dataset.samples):
        rgb = np.asarray(Image.open(path).convert("RGB"))
        want = expected(i, rgb, "resize(8, 8)", 8).astype(int)
        assert np.abs(images[i].astype(int) - want).mean() < 3, path
    loader.loader.close()


def test_image_folder_the_library_cannot_list_alike_is_read_through_getitem(photo_folder, caplog):
    datasets = torchvision_datasets()
    Image.fromarray(picture(20)).save(photo_folder / "cat" / "z.bmp")
    dataset = datasets.ImageFolder(str(photo_folder))
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        loader = stoker.Loader(dataset, batch_size=5, transform="resize(8, 8)", seed=SEED)
    assert any("z.bmp) is not a .jpg, .jpeg or .png file" in r.getMessage() for r in caplog.records)
    assert "source" not in loader.options
    with loader:
        batches = first_epoch(loader)
    labels = np.concatenate([b["label"] for b in batches]).tolist()
    assert labels == [target for _, target in dataset.samples]
    images = np.concatenate([b["image"] for b in batches])
    k = [path for path, _ in dataset.samples].index(str(photo_folder / "cat" / "z.bmp"))
    np.testing.assert_array_equal(images[k], expected(k, picture(20), "resize(8, 8)", 8))


def test_image_folder_with_python_transforms_stays_on_the_callback_path(photo_folder, caplog):
    datasets = torchvision_datasets()
    import torchvision.transforms as T

    from stoker.torch import DataLoader

    transform = T.Compose([T.Resize((8, 8)), T.PILToTensor()])
    dataset = datasets.ImageFolder(str(photo_folder), transform=transform)
    with caplog.at_level(logging.DEBUG, logger="stoker"):
        loader = DataLoader(dataset, batch_size=9)
    assert any("transform is set" in r.getMessage() for r in caplog.records)
    (images, labels), = list(loader)
    want = [dataset[i] for i in range(len(dataset))]
    np.testing.assert_array_equal(np.asarray(images), np.stack([np.asarray(x) for x, _ in want]))
    assert labels.tolist() == [y for _, y in want]
    loader.loader.close()


def test_a_vision_dataset_with_its_own_file_list_is_compared_file_by_file(photo_folder, caplog):
    datasets = torchvision_datasets()

    class Listed(datasets.VisionDataset):
        """A VisionDataset with an ImageFolder's attributes but a list of its own."""

        def __init__(self, root, samples):
            super().__init__(root)
            self.classes = ["bird", "cat", "dog"]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
            self.samples = samples
            self.loader = datasets.folder.default_loader

        def __len__(self):
            return len(self.samples)

        def __getitem__(self, i):
            path, target = self.samples[i]
            return self.loader(path), target

    full = datasets.ImageFolder(str(photo_folder)).samples
    for samples, native in [(full, True), (full[::-1], False)]:
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="stoker"):
            dataset = Listed(str(photo_folder), samples)
            loader = stoker.Loader(dataset, batch_size=9, transform="resize(8, 8)")
        assert ("source" in loader.options) == native, caplog.text
        with loader:
            (batch,) = first_epoch(loader)
        assert batch["label"].tolist() == [t for _, t in samples]


# ---- docs/porting.md ------------------------------------------------------------------------

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "porting.md"


def guide_sections():
    """The ```python blocks of docs/porting.md, grouped by ``##`` section."""
    text = GUIDE.read_text()
    sections: dict[str, list[str]] = {}
    title = ""
    for m in re.finditer(r"^## ([^\n]*)$|^```python\n(.*?)^```$", text, re.M | re.S):
        if m.group(1) is not None:
            title = m.group(1)
        else:
            sections.setdefault(title, []).append(m.group(2))
    return sections


def test_the_guide_has_its_sections():
    assert set(guide_sections()) >= {
        "ImageFolder",
        "A custom map-style dataset",
        "An IterableDataset",
        "DistributedSampler",
        "pin_memory and non_blocking",
    }


@pytest.fixture
def train_folder(tmp_path):
    """ROOT/{cat,dog}/k.jpg: 24 photo-like JPEGs per class, landscape and portrait."""
    rng = np.random.default_rng(5)
    for c, cls in enumerate(("cat", "dog")):
        (tmp_path / cls).mkdir()
        for k in range(24):
            h, w = (75, 100) if k % 3 else (100, 75)
            y, x = np.mgrid[0:h, 0:w]
            rgb = np.stack([np.sin(x / (4 + k % 5) + c), np.cos(y / 7 + k), x / w], -1)
            rgb = (rgb - rgb.min()) / np.ptp(rgb) * 220 + rng.uniform(0, 30, rgb.shape)
            Image.fromarray(rgb.astype(np.uint8)).save(tmp_path / cls / f"{k}.jpg", quality=90)
    return tmp_path


@pytest.mark.parametrize("title", list(guide_sections()))
def test_guide_section_runs(title, train_folder):
    torchvision_datasets()
    namespace: dict = {}
    for i, code in enumerate(guide_sections()[title]):
        code = code.replace("/data/train", str(train_folder))
        code = re.sub(r"range\(\d+\)", "range(1)", code)
        exec(compile(code, f"<docs/porting.md: {title}, block {i + 1}>", "exec"), namespace)
        loader = namespace.get("loader")
        batch = next(iter(loader))
        assert len(batch) == 2 and len(batch[0]) == len(batch[1]) > 0
        close = getattr(getattr(loader, "loader", None), "close", None)
        if close is not None:
            close()


def test_an_image_folder_edited_or_read_its_own_way_is_read_through_getitem(photo_folder, caplog):
    """Sample i is what `dataset[i]` gives on either path: a file list edited after the scan,
    or a subclass with its own `__getitem__` or `__len__`, is not the folder the library would
    list."""
    datasets = torchvision_datasets()

    class Shifted(datasets.ImageFolder):
        def __getitem__(self, i):
            image, target = super().__getitem__(i)
            return image, target + 100

    class Shorter(datasets.ImageFolder):
        def __len__(self):
            return 4

    def every_other(d):
        d.samples = d.imgs = d.samples[::2]
        d.targets = [t for _, t in d.samples]

    def reversed_(d):
        d.samples = d.imgs = d.samples[::-1]

    for make, edit, why in [
        (Shifted, None, "its own __getitem__"),
        (Shorter, None, "its own __len__"),
        (datasets.ImageFolder, every_other, "image files"),
        (datasets.ImageFolder, reversed_, "torchvision's order"),
    ]:
        dataset = make(str(photo_folder))
        if edit is not None:
            edit(dataset)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="stoker"):
            loader = stoker.Loader(dataset, batch_size=2, transform="resize(8, 8)")
        assert any(why in r.getMessage() for r in caplog.records), caplog.text
        assert "source" not in loader.options
        with loader:
            labels = np.concatenate([b["label"] for b in first_epoch(loader)]).tolist()
        assert labels == [dataset[i][1] for i in range(len(dataset))], make.__name__
