"""Batches as zero-copy NumPy arrays and DLPack exports.

A ``stoker_batch`` is a lease on arena memory. One ``_Lease`` object owns that handle and
releases it when Python frees the lease; every array made from the batch has the lease in its
``base`` chain (array -> ``_FieldMemory`` -> ``_Lease``), so the memory stays valid while any
array lives, whatever happened to the ``Batch`` object or the ``Loader``. DLPack exports hold
their own share of the batch inside the library and need no Python owner.

bfloat16: NumPy has no such type, so ``batch["x"]`` of a bfloat16 field is the raw bits as a
``uint16`` array; ``batch.torch()`` gives a proper ``torch.bfloat16`` tensor. A uint16 field
(16-bit tensor images) is a ``uint16`` array and a ``torch.uint16`` tensor; ``batch.dtype(name)``
tells the two apart.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
from numpy.typing import NDArray

from . import _ffi
from .errors import check

if TYPE_CHECKING:
    import torch


class _Lease:
    """Owns one ``stoker_batch*`` and releases it exactly once, when the last user is gone."""

    __slots__ = ("ptr",)

    # Bound at class creation so that release still works while the interpreter shuts down.
    _release = _ffi.lib.stoker_batch_release

    def __init__(self, ptr: int) -> None:
        self.ptr: int | None = ptr

    def __del__(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr:
            self._release(ptr)


class _FieldMemory:
    """One field's memory as NumPy's ``__array_interface__``; it becomes the array's ``base``
    and keeps the lease (and so the memory) alive for as long as the array lives."""

    __slots__ = ("__array_interface__", "_lease")

    def __init__(self, lease: _Lease, t: _ffi.Tensor) -> None:
        size = _ffi.DTYPE_ITEMSIZE[t.dtype]
        self._lease = lease
        self.__array_interface__ = {
            "version": 3,
            "data": (t.data or 0, False),  # writable: the batch belongs to its consumer
            "typestr": _ffi.DTYPE_NUMPY[t.dtype],
            "shape": tuple(t.shape[: t.ndim]),
            "strides": tuple(s * size for s in t.strides[: t.ndim]),
        }


class _NeedsVersionedDLPack(BufferError):
    """Raised by ``__dlpack__`` for consumers that cannot take a ``dltensor_versioned`` capsule."""


# Our own handle on the C API (not the shared ctypes.pythonapi), so that the signatures set
# here cannot clash with another library's.
_pyapi = ctypes.PyDLL(None)
_pyapi.PyCapsule_New.restype = ctypes.py_object
_pyapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# Destructor arguments are raw pointers: the capsule is being freed (refcount 0), and a
# py_object argument would resurrect and free it a second time.
_pyapi.PyCapsule_IsValid.restype = ctypes.c_int
_pyapi.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_pyapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_pyapi.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]

# PyCapsule_New keeps this pointer, so the name must live as long as the module.
_CAPSULE_NAME = ctypes.c_char_p(b"dltensor_versioned")


def _destroy_capsule(capsule: int | None) -> None:
    """DLPack rule: a consumer renames the capsule to ``used_dltensor_versioned`` and becomes
    responsible for the deleter; a capsule still under its original name was never consumed,
    so its export is deleted here."""
    if _pyapi.PyCapsule_IsValid(capsule, _CAPSULE_NAME):
        ptr = _pyapi.PyCapsule_GetPointer(capsule, _CAPSULE_NAME)
        managed = ctypes.cast(ptr, ctypes.POINTER(_ffi.DLManagedTensorVersioned))
        managed.contents.deleter(managed)


_capsule_destructor = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(_destroy_capsule)
_DESTRUCTOR_PTR = ctypes.cast(_capsule_destructor, ctypes.c_void_p)


class DLPackField:
    """One field of a batch for any DLPack consumer: ``torch.from_dlpack(batch.dlpack("image"))``.

    Each ``__dlpack__`` call makes a new export (``stoker_batch_to_dlpack``) that shares the
    batch's memory without a copy and keeps it alive until the consumer's tensor is freed.
    """

    __slots__ = ("_lease", "_index", "_device")

    def __init__(self, lease: _Lease, index: int, device: tuple[int, int]) -> None:
        self._lease = lease
        self._index = index
        self._device = device

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """Returns a ``dltensor_versioned`` capsule (DLPack >= 1.0 consumers only).

        Host batches are complete when the loader hands them out. For a CUDA batch the
        consumer's ``stream`` is made to wait for the batch's copy (``stoker_batch_wait``),
        with DLPack's stream codes: ``None`` or 1 the legacy default stream, 2 the per-thread
        default stream, -1 no synchronisation, anything else a ``cudaStream_t`` address.
        """
        if max_version is None or tuple(max_version)[0] < 1:
            raise _NeedsVersionedDLPack(
                "stoker exports DLPack 1.0 (dltensor_versioned) only; the consumer did not "
                "pass max_version >= (1, 0)"
            )
        if copy:
            raise BufferError("stoker exports without copying; copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self._device:
            raise BufferError(f"batch lives on DLPack device {self._device}, not {dl_device}")
        if self._device[0] == _ffi.DEVICE_CUDA and stream != -1:
            # DLPack's codes 1 and 2 are CUDA's CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
            check(_ffi.lib.stoker_batch_wait(self._lease.ptr, 1 if stream is None else stream))
        out = ctypes.POINTER(_ffi.DLManagedTensorVersioned)()
        check(_ffi.lib.stoker_batch_to_dlpack(self._lease.ptr, self._index, ctypes.byref(out)))
        try:
            return _pyapi.PyCapsule_New(
                ctypes.cast(out, ctypes.c_void_p), _CAPSULE_NAME, _DESTRUCTOR_PTR
            )
        except BaseException:
            out.contents.deleter(out)
            raise


class Batch(Mapping[str, NDArray[Any]]):
    """One batch: a read-only mapping from field name to a zero-copy NumPy array.

    Field order is the library's: ``image``, ``label`` for image sources; ``data`` (then
    ``label``) for npy sources. ``len(batch)`` is the number of fields; ``batch.size`` the
    number of samples.
    """

    __slots__ = ("_lease", "_tensors", "epoch")

    def __init__(self, ptr: int, epoch: int) -> None:
        self._lease = _Lease(ptr)
        self.epoch = epoch
        self._tensors: dict[str, tuple[int, _ffi.Tensor]] = {}
        for i in range(_ffi.lib.stoker_batch_num_fields(ptr)):
            t = _ffi.Tensor()
            check(_ffi.lib.stoker_batch_field(ptr, i, ctypes.byref(t)))
            self._tensors[t.name.decode()] = (i, t)

    def __getitem__(self, name: str) -> NDArray[Any]:
        t = self._tensors[name][1]
        if t.device_type == _ffi.DEVICE_CUDA:
            raise TypeError(
                f"field {name!r} lives in CUDA memory, which NumPy cannot view; use batch.torch()"
            )
        return np.asarray(_FieldMemory(self._lease, t))

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}: {_ffi.DTYPE_NAMES[t.dtype]}{list(t.shape[: t.ndim])}"
            for name, (_, t) in self._tensors.items()
        )
        return f"<stoker.Batch epoch={self.epoch} {{{fields}}}>"

    @property
    def size(self) -> int:
        """Samples in the batch: the leading dimension of a field that has one per sample. A
        ragged field under ``ragged="offsets"`` is flat (its leading dimension is every
        sample's rows), and its ``<name>_offsets`` has one entry more than there are samples."""
        for name, (_, t) in self._tensors.items():
            if name.endswith("_offsets") and name[: -len("_offsets")] in self._tensors:
                return int(t.shape[0]) - 1
            if f"{name}_offsets" not in self._tensors:
                return int(t.shape[0]) if t.ndim else 1
        return 0

    def dtype(self, name: str) -> str:
        """The field's element type as stoker names it (``bfloat16`` included)."""
        return _ffi.DTYPE_NAMES[self._tensors[name][1].dtype]

    def fields(self) -> dict[str, NDArray[Any]]:
        """Every field as a zero-copy NumPy array."""
        return {name: self[name] for name in self._tensors}

    def dlpack(self, name: str) -> DLPackField:
        """The field as a DLPack producer (``__dlpack__`` / ``__dlpack_device__``)."""
        i, t = self._tensors[name]
        return DLPackField(self._lease, i, (t.device_type, t.device_id))

    def torch(self) -> dict[str, torch.Tensor]:
        """Every field as a torch tensor sharing the batch's memory (no copy).

        A ragged field under ``ragged="offsets"`` comes as its values, ``[total, ...]``, and
        ``<name>_offsets``, int64 ``[size + 1]``: the pieces of a nested tensor,
        ``torch.nested.nested_tensor_from_jagged(out[name], out[name + "_offsets"])``.

        Uses versioned DLPack, through which torch makes its current stream wait for a CUDA
        batch's copy; with a torch that cannot consume versioned DLPack, falls back to
        ``torch.from_numpy`` on the zero-copy NumPy view (host memory only).
        """
        import torch

        out = {}
        for name, (_, t) in self._tensors.items():
            try:
                out[name] = torch.from_dlpack(self.dlpack(name))
            except _NeedsVersionedDLPack:
                if t.dtype == _ffi.DTYPE_BF16:
                    out[name] = torch.from_numpy(self[name].view(np.int16)).view(torch.bfloat16)
                else:
                    out[name] = torch.from_numpy(self[name])
        return out
