"""stoker: a data loader for ML training, over the libstoker C ABI (loaded with ctypes).

``Loader`` reads a source spec (``npy:PATH``, ``image_folder:ROOT``, ``tar:PATTERN``,
``packed:PATH``, written by ``pack``), a
map-style Python dataset or an iterable one (``stream_info()`` inside its ``__iter__``) and yields ``Batch`` objects whose fields are zero-copy NumPy arrays
(``batch["data"]``) or torch tensors through DLPack (``batch.torch()``);
``stoker.torch.DataLoader`` mimics ``torch.utils.data.DataLoader`` for porting code.
"""

from ._ffi import LIBRARY_PATH, LibraryNotFoundError, lib as _lib
from .batch import Batch, DLPackField
from .errors import (
    CallbackError,
    ClosedError,
    CudaError,
    DecodeError,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    StokerError,
    StokerIOError,
    StokerTimeoutError,
    UnsupportedError,
)
from .iterable import StreamInfo, stream_info
from .loader import Launch, Loader, Stats, launch
from .pack import pack, pack_merge
from .transform import transform_image

__version__: str = _lib.stoker_version().decode()
"""Version of the loaded library (the package is versioned with it)."""

__all__ = [
    "LIBRARY_PATH",
    "Batch",
    "CallbackError",
    "ClosedError",
    "CudaError",
    "DLPackField",
    "DecodeError",
    "InternalError",
    "InvalidArgumentError",
    "Launch",
    "LibraryNotFoundError",
    "Loader",
    "OutOfMemoryError",
    "Stats",
    "StokerError",
    "StreamInfo",
    "StokerIOError",
    "StokerTimeoutError",
    "UnsupportedError",
    "launch",
    "pack",
    "pack_merge",
    "stream_info",
    "transform_image",
]
