"""A ``torch.utils.data.DataLoader``-shaped face of ``stoker.Loader``, for porting code.

    from stoker.torch import DataLoader
    loader = DataLoader("image_folder:/data/train", batch_size=256, shuffle=True, num_workers=8,
                        transform="random_resized_crop(224) | hflip | normalize(imagenet)")
    for epoch in range(90):
        for images, labels in loader:      # torch tensors sharing stoker's memory (DLPack)
            ...

Differences from torch that porting code may notice:
* the dataset is a stoker source spec (``image_folder:ROOT``, ``npy:PATH``) or a map-style
  dataset whose items stoker can take (see ``stoker.dataset``: arrays, labels, encoded image
  bytes), and augmentation is a ``transform`` spec run inside stoker, not Python callables;
* workers are threads and always persist across epochs: ``persistent_workers`` is accepted
  and has nothing to change;
* ``shuffle`` draws its seed from torch's global RNG once, at construction, as torch's
  RandomSampler does per epoch, so ``torch.manual_seed`` makes runs reproducible; every later
  epoch's order follows from that seed.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .loader import Loader


class DataLoader:
    """Yields one tuple of tensors per batch, in the source's field order: ``(images, labels)``
    for ``image_folder``, ``(data, labels)`` for ``npy`` with ``labels=``."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        num_workers: int = 0,
        pin_memory: bool = False,
        drop_last: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        seed: int | None = None,
        **options: Any,
    ) -> None:
        if seed is None and shuffle:
            seed = int(torch.empty((), dtype=torch.int64).random_().item()) & (2**63 - 1)
        self.batch_size = batch_size
        self.persistent_workers = persistent_workers
        self._loader = Loader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            num_workers=num_workers,
            pin_memory=pin_memory,
            drop_last=drop_last,
            prefetch_factor=prefetch_factor,
            seed=seed,
            **options,
        )
        self._in_epoch = False

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        """One whole epoch, like torch: an epoch left unfinished (``break``) is drained first,
        so every ``for`` starts at the beginning of an epoch."""
        if self._in_epoch:
            for _ in self._loader:
                pass
        self._in_epoch = True
        for batch in self._loader:
            yield tuple(batch.torch().values())
        self._in_epoch = False

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def loader(self) -> Loader:
        """The underlying ``stoker.Loader`` (stats, epoch, close)."""
        return self._loader

    def state_dict(self) -> dict[str, str]:
        """Where the loader stands, for ``load_state_dict`` (see ``stoker.Loader.state_dict``)."""
        return self._loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        """Continues exactly where the saved loader stopped, mid-epoch included."""
        self._loader.load_state_dict(state_dict)
        # A saved state may stand mid-epoch; the next `for` continues from there.
        self._in_epoch = False
