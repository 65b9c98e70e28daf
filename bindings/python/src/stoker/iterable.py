"""A Python iterable dataset (torch's ``IterableDataset``, whose ``__len__`` if any is a hint as in
torch, or any object with ``__iter__`` and no ``__len__``) as a stoker source, through the C
ABI's ``stoker_iterable_callbacks``.

stoker calls ``iter(dataset)`` once per rank and epoch and reads the iterator to its end (the
epoch's end). Inside ``__iter__``, and while its iterator runs, ``stoker.stream_info()`` says
which stream is being read: ``rank`` and ``world_size`` (to read this rank's share), ``seed`` and
``epoch`` (to reshuffle). ``worker`` is always 0 and ``num_workers`` 1: one stream per rank is
read in order, so batches are the same for a seed whatever ``num_workers`` is; decoding,
transforms and collation still run on stoker's workers.

Items take the same forms as a map-style dataset's (see ``stoker.dataset``): a dict, a pair
``(x, label)`` or a single value; ``bytes`` are encoded images. An exception from the iterator
fails that sample (``CallbackError``, or replaced under ``on_error="skip"``), which ends a
generator's stream; one from ``__iter__`` fails the loader.

A stream must give the same items for the same ``stream_info()``: a resumed loader
(``load_state_dict``) replays the epoch from its start, reading items, not decoding them. Set
``num_samples`` to give every rank the same number of batches with uneven streams (a rank whose
stream ends sooner reads it again from the start); ``shuffle_buffer=N`` shuffles through a
buffer of N samples.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
import sys
import threading
from typing import Any

from . import _ffi
from .dataset import ItemForm, _put
from .errors import check


@dataclasses.dataclass(frozen=True)
class StreamInfo:
    """The stream an iterable source is asked for (``stoker_stream_info``)."""

    rank: int
    world_size: int
    worker: int
    num_workers: int
    seed: int
    epoch: int


_local = threading.local()


def stream_info() -> StreamInfo | None:
    """Inside an iterable source's ``__iter__`` (and its iterator): the stream stoker is
    reading; ``None`` elsewhere."""
    return getattr(_local, "info", None)


# Sources the library holds, with the form of their items, by the `user` key it passes back
# (removed when it calls drop), and open streams by their handle (removed on close).
_sources: dict[int, tuple[Any, ItemForm]] = {}
_streams: dict[int, tuple[Any, StreamInfo, ItemForm]] = {}
_keys = itertools.count(1)
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A parent thread (a stream's feeder) may have held `_lock` at the moment of the fork; it
    # does not exist in the child, which would wait for the lock forever when it opens a stream.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _message(what: str, e: BaseException) -> bytes:
    return f"{what} raised {type(e).__name__}: {e}".encode("utf-8", "replace")


def _open(user: int, info_p: Any, resume: bytes | None, out: Any) -> int:
    try:
        raw = info_p.contents
        info = StreamInfo(
            **{f.name: int(getattr(raw, f.name)) for f in dataclasses.fields(StreamInfo)}
        )
        _local.info = info
        dataset, form = _sources[user]
        try:
            iterator = iter(dataset)
        finally:
            _local.info = None
        with _lock:
            key = next(_keys)
            _streams[key] = (iterator, info, form)
        out[0] = key
        return 0
    except BaseException as e:  # nothing can be raised through C
        _ffi.lib.stoker_stream_fail(_message("iter(dataset)", e))
        return 1


def _next(user: int, stream: int, sample: int) -> int:
    entry = _streams.get(stream)
    if entry is None:
        _ffi.lib.stoker_sample_fail(sample, b"next() on a stream that is not open")
        return 2
    iterator, info, form = entry
    _local.info = info
    try:
        item = next(iterator)
    except StopIteration:
        return _ffi.END_OF_EPOCH
    except BaseException as e:
        where = f"the iterator of rank {info.rank} epoch {info.epoch}"
        _ffi.lib.stoker_sample_fail(sample, _message(where, e))
        return 2
    finally:
        _local.info = None
    try:
        _put(sample, item, form)
        return 0
    except BaseException as e:
        _ffi.lib.stoker_sample_fail(sample, _message("an item", e))
        return 2


def _close(user: int, stream: int) -> None:
    with _lock:
        entry = _streams.pop(stream, None)
    close = getattr(entry[0], "close", None) if entry else None
    if close is not None:
        try:
            close()  # a generator's finally blocks run now, not at garbage collection
        except BaseException:
            pass


def _drop(user: int) -> None:
    _sources.pop(user, None)


# Module-lifetime thunks: the library may call them from any thread until it calls drop.
_OPEN, _NEXT, _CLOSE, _DROP = (
    _ffi.OpenFn(_open),
    _ffi.NextFn(_next),
    _ffi.CloseFn(_close),
    _ffi.DropFn(_drop),
)


def is_iterable_source(obj: Any) -> bool:
    """A torch ``IterableDataset`` (whose ``__len__``, if it has one, is a hint, as in torch), or
    an object with ``__iter__`` and no ``__len__``."""
    data = sys.modules.get("torch.utils.data")  # no torch import for a job without it
    if data is not None and isinstance(obj, data.IterableDataset):
        return True
    return hasattr(obj, "__iter__") and not hasattr(obj, "__len__")


def set_iterable(options: int, dataset: Any, form: ItemForm) -> None:
    """Makes the iterable ``dataset`` the source of the ``stoker_options*`` ``options``;
    ``form`` learns the form of its items."""
    key = next(_keys)
    _sources[key] = (dataset, form)
    callbacks = _ffi.IterableCallbacks(key, _OPEN, _NEXT, _CLOSE, _DROP, _ffi.SaveStateFn())
    # From here the library owns the entry: it calls drop on failure too.
    check(_ffi.lib.stoker_options_set_iterable_callbacks(options, ctypes.byref(callbacks)))
