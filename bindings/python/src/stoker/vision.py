"""torchvision's folder datasets recognised: their files read and decoded in the library.

A ``torchvision.datasets.ImageFolder`` (or ``DatasetFolder``, or any ``VisionDataset`` with
``samples`` of ``(path, class)`` and ``root``) handed to ``stoker.Loader`` or
``stoker.torch.DataLoader`` is a list of image files. When nothing Python-side would touch a
sample — no ``transform``, ``target_transform`` or ``transforms``, torchvision's own image
loader — and its file list is the one ``image_folder:ROOT`` indexes (same files, class indices
and order), the loader reads ``image_folder:ROOT`` instead: files are read, decoded and
transformed in the library's threads, never under the GIL. A debug-level line on the
``stoker`` logger says so, or why not.

Otherwise the dataset is read through ``__getitem__`` (see ``stoker.dataset``), which is correct
but runs each sample's Python under the GIL.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger("stoker")

# The extensions `image_folder:ROOT` takes (the core's `IMAGE_EXTENSIONS`).
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def native_source(dataset: Any) -> str | None:
    """``image_folder:ROOT`` when ``dataset`` is a torchvision folder dataset the library can
    read itself with the same samples in the same order, else ``None``."""
    datasets = sys.modules.get("torchvision.datasets")
    # A dataset object of torchvision's was made by an imported torchvision.
    if datasets is None or not isinstance(dataset, datasets.VisionDataset):
        return None
    name = type(dataset).__name__
    why_not = _why_not_native(dataset, datasets)
    if why_not is not None:
        log.debug("%s: read through __getitem__ (Python, under the GIL): %s", name, why_not)
        return None
    spec = f"image_folder:{os.fspath(dataset.root)}"
    log.debug(
        "%s of %d files: read natively as %s (files read and decoded in the library, no GIL)",
        name,
        len(dataset.samples),
        spec,
    )
    return spec


def _why_not_native(dataset: Any, datasets: Any) -> str | None:
    """Why the library cannot read ``dataset``'s files itself with the same result, or
    ``None`` if it can."""
    for attr in ("transform", "target_transform", "transforms"):
        if getattr(dataset, attr, None) is not None:
            return f"{attr} is set (a Python callable; pass transform=None and a stoker transform=)"
    # A DatasetFolder subclass that reads its samples its own way (another label, another
    # image): the library would not call it. (Another VisionDataset defines both of its own;
    # its file list and loader are what is compared.)
    if isinstance(dataset, datasets.DatasetFolder):
        for method in ("__getitem__", "__len__"):
            if getattr(type(dataset), method) is not getattr(datasets.DatasetFolder, method):
                return f"its class defines its own {method}, which the library would not call"
    samples = getattr(dataset, "samples", None)
    if samples is None:
        samples = getattr(dataset, "imgs", None)
    root = getattr(dataset, "root", None)
    classes = getattr(dataset, "classes", None)
    if samples is None or root is None or classes is None:
        return "it has no samples/imgs, root and classes to read files from"
    folder = datasets.folder
    if getattr(dataset, "loader", None) not in (folder.default_loader, folder.pil_loader):
        return "its loader is not torchvision's default image loader"
    root = os.fspath(root)
    class_dirs = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if list(classes) != class_dirs:
        return f"its classes are not the sorted subdirectories of {root}"
    class_to_idx = {c: i for i, c in enumerate(class_dirs)}
    if getattr(dataset, "class_to_idx", class_to_idx) != class_to_idx:
        return "its class_to_idx is not the classes' sorted order"
    if _same_files_as_image_folder(dataset, datasets):
        # torchvision's own scan with extensions that include stoker's: the lists are equal when
        # every file found has one of stoker's extensions (checked below), unless the list was
        # edited since (checked by _edited).
        expected = None
    else:
        expected = folder.make_dataset(root, class_to_idx, extensions=_IMAGE_EXTENSIONS)
    seen = set()
    for i, sample in enumerate(samples):
        path, target = sample
        if not path.lower().endswith(_IMAGE_EXTENSIONS):
            return f"sample {i} ({path}) is not a .jpg, .jpeg or .png file"
        seen.add(target)
    if len(seen) != len(class_dirs):
        return "a class has no image (image_folder refuses empty classes)"
    if expected is not None and [tuple(s) for s in samples] != expected:
        return f"its samples are not the image files under {root} in torchvision's order"
    if expected is None:
        return _edited(samples, root, class_dirs)
    return None


def _edited(samples: Any, root: str, class_dirs: list[str]) -> str | None:
    """Why ``samples``, found by torchvision's own scan, are no longer what it found, or ``None``:
    they must be in the scan's order (class, then folder, then name), each file once, and as many
    as the folder's image files (one directory walk, without a second scan's per-file work)."""
    previous = None
    for path, target in samples:
        key = (target, os.path.dirname(path), os.path.basename(path))
        if previous is not None and key <= previous:
            return f"its samples are not the image files under {root} in torchvision's order"
        previous = key
    count = sum(
        name.lower().endswith(_IMAGE_EXTENSIONS)
        for c in class_dirs
        for _, _, names in os.walk(os.path.join(root, c), followlinks=True)
        for name in names
    )
    if len(samples) != count:
        return f"it has {len(samples)} samples where {root} has {count} image files"
    return None


def _same_files_as_image_folder(dataset: Any, datasets: Any) -> bool:
    """Whether ``dataset`` found its samples with ``DatasetFolder``'s own scan, under extensions
    that include every one stoker takes (no ``is_valid_file``, which leaves ``extensions``
    None)."""
    folder_type = datasets.DatasetFolder
    if not isinstance(dataset, folder_type):
        return False
    own = all(
        getattr(type(dataset), m) is getattr(folder_type, m)
        for m in ("make_dataset", "find_classes")
    )
    extensions = getattr(dataset, "extensions", None)
    if isinstance(extensions, str):
        extensions = (extensions,)
    covered = extensions is not None and all(
        e in {x.lower() for x in extensions} for e in _IMAGE_EXTENSIONS
    )
    return own and covered
