"""A Python map-style dataset (``__len__`` + ``__getitem__``, like torch's ``Dataset``) as a
stoker source, through the C ABI's ``stoker_source_callbacks``.

``dataset[i]`` may return
* a dict ``{field: value}``;
* a pair ``(x, label)``, as torchvision datasets do;
* a single ``x``.
A value that is ``bytes`` (a JPEG or PNG file) goes to field ``image`` and is decoded and
transformed like an ``image_folder`` file; an int ``label`` becomes the int64 ``label`` field;
a PIL image is converted to RGB (as torchvision's loader does) and goes to field ``image`` as a
uint8 ``[H, W, 3]`` array; anything else is taken as an array (NumPy, or anything
``np.asarray`` accepts, such as a CPU torch tensor) of uint8, uint16, int32, int64, float16 or
float32, for field ``data`` when it is unnamed.

Images given as pixels — PIL images, uint8 arrays of shape ``[H, W, 3]`` or ``[3, H, W]`` (see
option ``input_layout``) — may differ in size from sample to sample when the ``transform``
fixes the output size (``random_resized_crop(S)``, ``center_crop(S)``, ``resize(H, W)``): each
is transformed from its own size, and the batch has the transform's. Without such a transform
every sample must have sample 0's shape. A PIL image costs one copy into a NumPy array (Pillow
keeps RGB pixels 4 bytes apart, so there is no packed view of them); the library then copies it
into its worker's buffer, as it does any tensor.

stoker calls ``__getitem__`` from its worker threads, one call at a time: a dataset written for
torch's worker processes (each with its own copy, so never two calls at once) may keep state
between calls, such as a file it opens on first use and seeks in. Decoding and transforms still
run in parallel inside stoker; the Python part of reading does not, even where it releases the
GIL (file reads, Pillow's decode), so a call that waits (a network read, a slow disk) holds up
every worker's next read for as long. A dataset safe to call from several threads at once (one
that opens its files in each call, as torchvision's folder datasets do) says so with the
loader's ``concurrent_getitem=True``: its calls then overlap wherever they release the GIL.

An exception in ``__getitem__`` fails the batch with a ``CallbackError`` naming the index and the
exception, which is its ``__cause__`` (traceback included), or, under ``on_error="skip"``,
replaces the sample and is counted; ``KeyboardInterrupt`` is raised again from the loader.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import sys
import threading
from typing import Any, Iterable

import numpy as np

from . import _ffi
from .errors import check

_STOKER_DTYPE = {
    np.dtype(np.uint8): _ffi.DTYPE_U8,
    np.dtype(np.uint16): _ffi.DTYPE_U16,
    np.dtype(np.int32): _ffi.DTYPE_I32,
    np.dtype(np.int64): _ffi.DTYPE_I64,
    np.dtype(np.float16): _ffi.DTYPE_F16,
    np.dtype(np.float32): _ffi.DTYPE_F32,
}

# The datasets the library holds, by the `user` key it passes back, each with the lock its
# `__getitem__` calls take turns on (none under concurrent_getitem) and the form of its items;
# an entry lives until the library calls drop (when the last loader or options object using it
# is freed).
_datasets: dict[int, tuple[Any, contextlib.AbstractContextManager[Any], ItemForm]] = {}
_keys = itertools.count(1)
# A KeyboardInterrupt (or SystemExit) raised in `__getitem__`: it cannot pass through the
# library, which fails the sample instead; the loader raises it again when the library returns.
interrupted: BaseException | None = None
# The exceptions `__getitem__` raised, by the message the library was given: the loader chains
# one to the CallbackError that carries its message. Bounded, since under on_error="skip" none
# is asked for.
_failures: collections.OrderedDict[str, BaseException] = collections.OrderedDict()
_failures_lock = threading.Lock()
_MAX_FAILURES = 64


def _form(item: Any) -> str:
    if isinstance(item, dict):
        return "mapping"
    if isinstance(item, tuple) and len(item) == 2:
        return "pair"
    return "single"


class ItemForm:
    """The form of a Python source's items, as its first item read shows it: ``"mapping"`` (a
    dict), ``"pair"`` (``(x, label)``) or ``"single"``; ``None`` until one is read.
    ``stoker.torch`` gives each batch this form, as torch's ``default_collate`` does."""

    kind: str | None = None

    def see(self, item: Any) -> None:
        if self.kind is None:
            self.kind = _form(item)


def _fields(item: Any) -> Iterable[tuple[str, Any]]:
    form = _form(item)
    if form == "mapping":
        mapping: dict[str, Any] = item
        return mapping.items()
    if form == "pair":
        x, label = item
        return [(_unnamed(x), x), ("label", label)]
    return [(_unnamed(item), item)]


def _unnamed(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)) or _is_pil(value):
        return "image"
    return "data"


def _is_pil(value: Any) -> bool:
    # A PIL image was made by an imported PIL: no import here for datasets without one.
    image = sys.modules.get("PIL.Image")
    return image is not None and isinstance(value, image.Image)


def _pixels(image: Any) -> np.ndarray:
    """A PIL image as a uint8 ``[H, W, 3]`` RGB array."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.asarray(image)


def _put(sample: int, item: Any, form: ItemForm) -> None:
    form.see(item)
    for name, value in _fields(item):
        if _is_pil(value):
            value = _pixels(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            if name != "image":
                raise TypeError(f"encoded image bytes go to field 'image', not {name!r}")
            data = bytes(value)
            check(_ffi.lib.stoker_sample_put_encoded(sample, data, len(data)))
        elif name == "label" and isinstance(value, (int, np.integer)):
            check(_ffi.lib.stoker_sample_put_label(sample, int(value)))
        else:
            # np.ascontiguousarray would make a 0-d value 1-d: a scalar stays one, so that a
            # batch of them is [B], as torch's collate makes it.
            array = np.asarray(value)
            if array.ndim:
                array = np.ascontiguousarray(array)
            dtype = _STOKER_DTYPE.get(array.dtype)
            if dtype is None:
                raise TypeError(
                    f"field {name!r} has dtype {array.dtype}; stoker takes "
                    + ", ".join(str(d) for d in _STOKER_DTYPE)
                )
            shape = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
            check(
                _ffi.lib.stoker_sample_put_tensor(
                    sample, name.encode(), dtype, array.ndim, shape, array.ctypes.data
                )
            )


def _len(user: int) -> int:
    try:
        return len(_datasets[user][0])
    except Exception:  # nothing can be raised through C (set_source raised it already)
        return 0


def _read(user: int, index: int, sample: int) -> int:
    global interrupted
    try:
        dataset, lock, form = _datasets[user]
        with lock:
            item = dataset[index]
        _put(sample, item, form)
        return 0
    except BaseException as e:
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            interrupted = e
        message = f"dataset[{index}] raised {type(e).__name__}: {e}"
        with _failures_lock:
            _failures[message] = e
            while len(_failures) > _MAX_FAILURES:
                _failures.popitem(last=False)
        _ffi.lib.stoker_sample_fail(sample, message.encode("utf-8", "replace"))
        return 1


def raise_interrupt() -> None:
    """Raises the ``KeyboardInterrupt`` (or ``SystemExit``) a ``__getitem__`` call met since the
    last call, if one did."""
    global interrupted
    e, interrupted = interrupted, None
    if e is not None:
        raise e


def failure_in(text: str) -> BaseException | None:
    """The exception of a ``__getitem__`` call whose message ``text`` (a ``CallbackError``'s)
    holds, if one is remembered; it is forgotten then."""
    with _failures_lock:
        for message in reversed(_failures):
            if message in text:
                return _failures.pop(message)
    return None


def _drop(user: int) -> None:
    _datasets.pop(user, None)


# Module-lifetime thunks: the library may call them from any thread until it calls drop.
_LEN, _READ, _DROP = _ffi.LenFn(_len), _ffi.ReadFn(_read), _ffi.DropFn(_drop)


def set_source(options: int, dataset: Any, concurrent: bool, form: ItemForm) -> None:
    """Makes ``dataset`` the source of the ``stoker_options*`` ``options``; ``concurrent``: its
    ``__getitem__`` may run on several threads at once; ``form`` learns the form of its items.
    Raises what ``len(dataset)`` raises."""
    len(dataset)  # the library would take a failing __len__ for an empty dataset
    key = next(_keys)
    lock = contextlib.nullcontext() if concurrent else threading.Lock()
    _datasets[key] = (dataset, lock, form)
    callbacks = _ffi.SourceCallbacks(key, _LEN, _READ, _DROP)
    # From here the library owns the entry: it calls drop on failure too.
    check(_ffi.lib.stoker_options_set_source_callbacks(options, ctypes.byref(callbacks)))
