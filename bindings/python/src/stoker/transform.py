"""One image through a transform spec, as a loader's worker transforms it for one draw."""

from __future__ import annotations

import ctypes
import json
from typing import Any

import numpy as np

from ._ffi import lib as _lib
from .errors import check


def transform_image(
    spec: str,
    image: np.ndarray,
    output_shape: tuple[int, int],
    seed: int = 0,
    epoch: int = 0,
    index: int = 0,
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Transforms ``image`` (uint8 ``[H, W, 3]``) by ``spec`` exactly as a loader with this
    ``seed`` does for sample draw ``index`` of ``epoch``; returns the uint8 ``[h, w, 3]`` output
    (``output_shape`` = ``(h, w)``, the size the spec fixes) and the parameters each randomized
    operation drew, one dict per operation (``{"op": "rotate", "angle": 12.5}``). For checking
    what a spec does; a loader never needs it."""
    rgb = np.ascontiguousarray(image, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"image must be uint8 [H, W, 3], got shape {rgb.shape}")
    h, w = output_shape
    out = np.empty((h, w, 3), dtype=np.uint8)
    needed = ctypes.c_size_t(0)
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        check(
            _lib.stoker_transform_apply(
                spec.encode(),
                rgb.ctypes.data,
                rgb.shape[1],
                rgb.shape[0],
                seed,
                epoch,
                index,
                out.ctypes.data,
                out.nbytes,
                buf,
                size,
                ctypes.byref(needed),
            )
        )
        if needed.value < size:
            break
        size = needed.value + 1
    text = buf.value.decode()
    params = [json.loads(line) for line in text.splitlines() if line]
    return out, params
