"""Exceptions for the C ABI's error statuses, each carrying the library's own message.

Every class also derives from the closest builtin (ValueError, OSError, ...) so code written
for other loaders (``except OSError:``) keeps catching what it means to catch.
"""

from __future__ import annotations

import ctypes

from . import _ffi


class StokerError(Exception):
    """Base of every error stoker reports; ``status`` is the C ``stoker_status`` code."""

    status: int = 0

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidArgumentError(StokerError, ValueError):
    """Unknown option key, malformed value, bad field name (STOKER_ERR_INVALID_ARGUMENT)."""

    status = -1


class StokerIOError(StokerError, OSError):
    """Missing file, unreadable directory, short read (STOKER_ERR_IO)."""

    status = -2


class DecodeError(StokerError, ValueError):
    """A corrupt or unsupported sample; the message names the file or index (STOKER_ERR_DECODE)."""

    status = -3


class UnsupportedError(StokerError, NotImplementedError):
    """E.g. ``device="cuda"`` where no CUDA driver is present (STOKER_ERR_UNSUPPORTED)."""

    status = -4


class StokerTimeoutError(StokerError, TimeoutError):
    """No batch within ``timeout_ms`` (STOKER_ERR_TIMEOUT)."""

    status = -5


class CallbackError(StokerError):
    """A user callback reported failure (STOKER_ERR_CALLBACK)."""

    status = -6


class ClosedError(StokerError):
    """The loader was closed (STOKER_ERR_CLOSED, or a closed Python ``Loader``)."""

    status = -7


class InternalError(StokerError):
    """A bug in stoker: a caught panic (STOKER_ERR_INTERNAL)."""

    status = -8


class OutOfMemoryError(StokerError, MemoryError):
    """STOKER_ERR_OUT_OF_MEMORY."""

    status = -9


class CudaError(StokerError):
    """A CUDA driver call failed (STOKER_ERR_CUDA)."""

    status = -10


_BY_STATUS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        StokerIOError,
        DecodeError,
        UnsupportedError,
        StokerTimeoutError,
        CallbackError,
        ClosedError,
        InternalError,
        OutOfMemoryError,
        CudaError,
    )
}


def last_error() -> str:
    """The message of the last failed call on this thread (the library keeps it per thread)."""
    n = _ffi.lib.stoker_last_error(None, 0)
    if n == 0:
        return ""
    buf = ctypes.create_string_buffer(n + 1)
    _ffi.lib.stoker_last_error(buf, n + 1)
    return buf.value.decode("utf-8", errors="replace")


def check(status: int) -> int:
    """Returns OK / END_OF_EPOCH unchanged; raises the matching exception for an error status.

    Must run on the thread that made the failed call, right after it.
    """
    if status >= 0:
        return status
    cls = _BY_STATUS.get(status)
    message = last_error() or f"stoker call failed with status {status}"
    if cls is None:
        err = StokerError(f"{message} (unknown status {status})")
        err.status = status
        raise err
    raise cls(message)
