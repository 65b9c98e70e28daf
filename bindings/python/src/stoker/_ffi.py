"""ctypes declarations of the stoker C ABI (include/stoker.h) and the lookup of libstoker.so.

The package has no compiled extension: it dlopens the one shared library every binding uses,
so a wheel works with any CPython 3 and the library can be swapped with ``STOKER_LIBRARY``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

ABI_VERSION = 1
MAX_DIMS = 8

# stoker_status
OK = 0
END_OF_EPOCH = 1

# stoker_dtype -> NumPy type string (bfloat16 has none: its raw bits are exposed as uint16)
DTYPE_U8, DTYPE_I32, DTYPE_I64, DTYPE_F16, DTYPE_BF16, DTYPE_F32, DTYPE_U16 = range(7)
DTYPE_NAMES = {
    DTYPE_U8: "uint8",
    DTYPE_I32: "int32",
    DTYPE_I64: "int64",
    DTYPE_F16: "float16",
    DTYPE_BF16: "bfloat16",
    DTYPE_F32: "float32",
    DTYPE_U16: "uint16",
}
_NATIVE = "<" if sys.byteorder == "little" else ">"  # the library writes native byte order
DTYPE_NUMPY = {
    DTYPE_U8: "|u1",
    DTYPE_I32: _NATIVE + "i4",
    DTYPE_I64: _NATIVE + "i8",
    DTYPE_F16: _NATIVE + "f2",
    DTYPE_BF16: _NATIVE + "u2",
    DTYPE_F32: _NATIVE + "f4",
    DTYPE_U16: _NATIVE + "u2",
}
DTYPE_ITEMSIZE = {
    DTYPE_U8: 1,
    DTYPE_I32: 4,
    DTYPE_I64: 8,
    DTYPE_F16: 2,
    DTYPE_BF16: 2,
    DTYPE_F32: 4,
    DTYPE_U16: 2,
}

# DLPack device codes used in stoker_tensor.device_type
# (pinned host memory is DEVICE_CPU too: it is ordinary memory to a reader)
DEVICE_CPU, DEVICE_CUDA = 1, 2


class Tensor(ctypes.Structure):
    """``stoker_tensor``: one field of a batch, described like a DLPack tensor."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class Stats(ctypes.Structure):
    """``stoker_stats``; ``size`` is set to ``sizeof`` so the library fills only what fits."""

    _fields_ = [
        ("size", ctypes.c_uint64),
        ("batches", ctypes.c_uint64),
        ("samples", ctypes.c_uint64),
        ("samples_skipped", ctypes.c_uint64),
        ("wait_ns_total", ctypes.c_uint64),
        ("wait_ns_p50", ctypes.c_uint64),
        ("wait_ns_p95", ctypes.c_uint64),
        ("wait_ns_max", ctypes.c_uint64),
        ("elapsed_ns", ctypes.c_uint64),
        ("readiness", ctypes.c_double),
        ("worker_busy", ctypes.c_double),
        ("slabs_pinned", ctypes.c_uint64),
        ("pin_failures", ctypes.c_uint64),
        ("rank", ctypes.c_uint64),
        ("world_size", ctypes.c_uint64),
        ("local_rank", ctypes.c_uint64),
        ("local_world_size", ctypes.c_uint64),
        ("launcher", ctypes.c_uint64),
        ("read_ns", ctypes.c_uint64),
        ("decode_ns", ctypes.c_uint64),
        ("transform_ns", ctypes.c_uint64),
        ("collate_ns", ctypes.c_uint64),
        ("h2d_ns", ctypes.c_uint64),
        ("num_workers", ctypes.c_uint64),
        ("read_ns_p50", ctypes.c_uint64),
        ("read_ns_p95", ctypes.c_uint64),
        ("decode_ns_p50", ctypes.c_uint64),
        ("decode_ns_p95", ctypes.c_uint64),
        ("transform_ns_p50", ctypes.c_uint64),
        ("transform_ns_p95", ctypes.c_uint64),
        ("collate_ns_p50", ctypes.c_uint64),
        ("collate_ns_p95", ctypes.c_uint64),
        ("h2d_ns_p50", ctypes.c_uint64),
        ("h2d_ns_p95", ctypes.c_uint64),
        ("busy_ns", ctypes.c_uint64),
        ("memory_budget", ctypes.c_uint64),
        ("batch_bytes", ctypes.c_uint64),
        ("in_flight_cap", ctypes.c_uint64),
        ("in_flight_cap_requested", ctypes.c_uint64),
        ("prefetch_factor", ctypes.c_uint64),
        ("autotune_decisions", ctypes.c_uint64),
        ("decoded_zune", ctypes.c_uint64),
        ("decoded_turbo", ctypes.c_uint64),
        ("decoded_turbo_region", ctypes.c_uint64),
        ("decoded_turbo_scaled", ctypes.c_uint64),
        ("in_flight_depth", ctypes.c_uint64),
        ("batch_memory_bytes", ctypes.c_uint64),
        ("batch_memory_peak_bytes", ctypes.c_uint64),
        ("page_faults", ctypes.c_uint64),
        ("h2d_bytes", ctypes.c_uint64),
        ("device_memory_bytes", ctypes.c_uint64),
        ("decoded_device", ctypes.c_uint64),
        ("gpu_decode_share", ctypes.c_double),
    ]


class LaunchInfo(ctypes.Structure):
    """``stoker_launch``, as ``stoker_options_launch`` fills it."""

    _fields_ = [
        ("rank", ctypes.c_uint64),
        ("world_size", ctypes.c_uint64),
        ("local_rank", ctypes.c_uint64),
        ("local_world_size", ctypes.c_uint64),
        ("launcher", ctypes.c_uint64),
    ]


# stoker_launcher -> the name Loader.stats() gives
LAUNCHERS = {0: "none", 1: "explicit", 2: "torchrun", 3: "slurm", 4: "openmpi", 5: "pmi"}


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLDeleter),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

_P = ctypes.c_void_p  # opaque handles: stoker_options*, stoker_loader*, stoker_batch*, stoker_sample*
_STATUS = ctypes.c_int

# stoker_source_callbacks: the caller's map-style dataset.
LenFn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)
ReadFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p)
DropFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class SourceCallbacks(ctypes.Structure):
    _fields_ = [("user", ctypes.c_void_p), ("len", LenFn), ("read", ReadFn), ("drop", DropFn)]


class StreamInfo(ctypes.Structure):
    """``stoker_stream_info``: which stream an iterable source opens."""

    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("rank", "world_size", "worker", "num_workers", "seed", "epoch")
    ]


# stoker_iterable_callbacks: the caller's stream of samples.
OpenFn = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_void_p,
    ctypes.POINTER(StreamInfo),
    ctypes.c_char_p,
    ctypes.POINTER(ctypes.c_void_p),
)
NextFn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
CloseFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
SaveStateFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class IterableCallbacks(ctypes.Structure):
    _fields_ = [
        ("user", ctypes.c_void_p),
        ("open", OpenFn),
        ("next", NextFn),
        ("close", CloseFn),
        ("drop", DropFn),
        ("save_state", SaveStateFn),
    ]


_SIGNATURES = {
    "stoker_abi_version": (ctypes.c_uint32, []),
    "stoker_version": (ctypes.c_char_p, []),
    "stoker_last_error": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
    "stoker_options_new": (_P, []),
    "stoker_options_set": (_STATUS, [_P, ctypes.c_char_p, ctypes.c_char_p]),
    "stoker_options_free": (None, [_P]),
    "stoker_options_launch": (_STATUS, [_P, ctypes.POINTER(LaunchInfo)]),
    "stoker_options_set_source_callbacks": (_STATUS, [_P, ctypes.POINTER(SourceCallbacks)]),
    "stoker_sample_put_encoded": (_STATUS, [_P, ctypes.c_void_p, ctypes.c_size_t]),
    "stoker_sample_put_tensor": (
        _STATUS,
        [_P, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64), _P],
    ),
    "stoker_sample_put_label": (_STATUS, [_P, ctypes.c_int64]),
    "stoker_sample_fail": (_STATUS, [_P, ctypes.c_char_p]),
    "stoker_options_set_iterable_callbacks": (_STATUS, [_P, ctypes.POINTER(IterableCallbacks)]),
    "stoker_stream_fail": (_STATUS, [ctypes.c_char_p]),
    "stoker_loader_new": (_STATUS, [_P, ctypes.POINTER(_P)]),
    "stoker_loader_next": (_STATUS, [_P, ctypes.POINTER(_P)]),
    "stoker_loader_batches_per_epoch": (ctypes.c_int64, [_P]),
    "stoker_loader_epoch": (ctypes.c_uint64, [_P]),
    "stoker_loader_set_epoch": (_STATUS, [_P, ctypes.c_uint64]),
    "stoker_pack": (
        _STATUS,
        [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_uint32,
            ctypes.c_uint32,
            ctypes.c_char_p,
            ctypes.c_uint64,
            ctypes.c_uint32,
            ctypes.c_uint32,
        ],
    ),
    "stoker_pack_merge": (_STATUS, [ctypes.c_char_p]),
    "stoker_loader_stats": (_STATUS, [_P, ctypes.POINTER(Stats)]),
    "stoker_loader_close": (_STATUS, [_P]),
    "stoker_loader_worker_busy_ns": (
        _STATUS,
        [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stoker_loader_save_state": (
        _STATUS,
        [_P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "stoker_loader_free": (None, [_P]),
    "stoker_batch_num_fields": (ctypes.c_size_t, [_P]),
    "stoker_batch_field": (_STATUS, [_P, ctypes.c_size_t, ctypes.POINTER(Tensor)]),
    "stoker_batch_field_by_name": (_STATUS, [_P, ctypes.c_char_p, ctypes.POINTER(Tensor)]),
    "stoker_batch_to_dlpack": (
        _STATUS,
        [_P, ctypes.c_size_t, ctypes.POINTER(ctypes.POINTER(DLManagedTensorVersioned))],
    ),
    "stoker_batch_wait": (_STATUS, [_P, ctypes.c_void_p]),
    "stoker_batch_release": (None, [_P]),
    "stoker_transform_apply": (
        _STATUS,
        [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_uint64,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ],
    ),
}


class LibraryNotFoundError(ImportError):
    """No usable libstoker.so was found, or it speaks another ABI version."""


def _candidates() -> list[str]:
    """Where to look, in order: $STOKER_LIBRARY, the copy bundled in the package, the system."""
    env = os.environ.get("STOKER_LIBRARY")
    if env:
        # An explicit choice is never silently replaced by another copy.
        return [env]
    found = []
    bundled = Path(__file__).resolve().parent / "_lib" / "libstoker.so"
    if bundled.is_file():
        found.append(str(bundled))
    system = ctypes.util.find_library("stoker")
    if system:
        found.append(system)
    return found


def _load() -> ctypes.CDLL:
    candidates = _candidates()
    if not candidates:
        raise LibraryNotFoundError(
            "libstoker.so not found: set STOKER_LIBRARY to its path, reinstall the stoker "
            "package (which bundles it), or install it where ldconfig finds it"
        )
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        # The version first: a library of another ABI version may lack the other symbols.
        lib.stoker_abi_version.restype = ctypes.c_uint32
        lib.stoker_abi_version.argtypes = []
        version = lib.stoker_abi_version()
        if version != ABI_VERSION:
            raise LibraryNotFoundError(
                f"{path} has stoker C ABI version {version}, but this package needs "
                f"{ABI_VERSION}; install matching versions of the library and the package"
            )
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        return lib
    raise LibraryNotFoundError("could not load libstoker.so: " + "; ".join(errors))


lib = _load()
LIBRARY_PATH: str = lib._name
