"""Writing stoker's packed format: ``stoker.pack`` and ``stoker.pack_merge``, the same as
``stoker pack`` and ``stoker pack --merge`` (``docs/packed-format.md``); read the result with
``stoker.Loader("packed:OUT", ...)``."""

from __future__ import annotations

import os
from typing import Literal, Optional, Union

from . import _ffi
from .errors import check

PackMode = Literal["jpeg", "raw", "smart"]


def pack(
    src: str,
    out: Union[str, "os.PathLike[str]"],
    max_side: Optional[int] = None,
    quality: int = 90,
    mode: PackMode = "jpeg",
    shard_size: Optional[int] = None,
    *,
    shard_index: Optional[int] = None,
    num_shards: Optional[int] = None,
) -> None:
    """Packs the source spec ``src`` (``image_folder:ROOT``, ``tar:PATTERN``, ``npy:PATH``,
    ``packed:PATH``) into ``out``, on every core.

    ``max_side`` shrinks images whose longer side is larger (aspect kept; ``None`` or 0 keeps
    every size); ``mode`` stores them
    as ``"jpeg"`` (kept, or re-encoded at ``quality`` when shrunk), ``"raw"`` (RGB8 pixels, never
    decoded when read) or ``"smart"`` (raw up to 256x256 pixels, else jpeg). ``shard_size``
    (bytes) splits the output into shard files of a directory. ``shard_index`` of
    ``num_shards`` packs one contiguous slice, for packing on many machines; then call
    ``pack_merge(out)``. Files appear atomically and are byte-identical for the same input.
    """
    # The library checks every value and words the errors as on every face; here only what its
    # unsigned arguments cannot carry.
    if (shard_index is None) != (num_shards is None):
        raise ValueError("shard_index and num_shards go together")
    numbers = {
        "max_side": max_side,
        "quality": quality,
        "shard_size": shard_size,
        "shard_index": shard_index,
        "num_shards": num_shards,
    }
    for name, value in numbers.items():
        if value is not None and value < 0:
            raise ValueError(f"{name} {value} is negative")
    check(
        _ffi.lib.stoker_pack(
            src.encode(),
            os.fsencode(out),
            max_side or 0,
            quality,
            mode.encode(),
            shard_size or 0,
            shard_index or 0,
            num_shards or 0,
        )
    )


def pack_merge(out: Union[str, "os.PathLike[str]"]) -> None:
    """Writes the index of the slices packed into the directory ``out`` by separate
    ``pack(..., shard_index=I, num_shards=N)`` calls (every slice must be there)."""
    check(_ffi.lib.stoker_pack_merge(os.fsencode(out)))
