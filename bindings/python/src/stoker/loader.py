"""The Python face of ``stoker_loader``: options as keyword arguments, epochs as ``for`` loops."""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import os
import threading
import weakref
from typing import Any, Iterator

from . import _ffi
from .batch import Batch
from .dataset import ItemForm, failure_in, raise_interrupt, set_source
from .errors import CallbackError, ClosedError, InternalError, check
from .iterable import is_iterable_source, set_iterable
from .vision import native_source


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of the loader's statistics (``stoker_stats`` in ``include/stoker.h``).

    Times are in nanoseconds; waits are the consumer's, inside ``next_batch``.
    """

    batches: int
    """Batches delivered since the loader was created."""
    samples: int
    """Samples in those batches."""
    samples_skipped: int
    """Bad samples replaced under ``on_error="skip"``; a replacement that is bad too counts
    again."""
    wait_ns_total: int
    """Total time the consumer waited for batches."""
    wait_ns_p50: int
    """Median wait for one batch."""
    wait_ns_p95: int
    """95th percentile of the wait for one batch."""
    wait_ns_max: int
    """Longest wait for one batch."""
    elapsed_ns: int
    """Time since the first request for a batch."""
    readiness: float
    """``1 - waited / elapsed``: the share of time the consumer was not starved (1 is best)."""
    worker_busy: float
    """The share of the worker threads' time spent producing samples."""
    slabs_pinned: int
    """Arena slabs page-locked under ``pin_memory``."""
    pin_failures: int
    """Slabs ``mlock`` refused (RLIMIT_MEMLOCK): delivered unpinned."""
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str
    """Who resolved ``rank`` and ``world_size``: ``"torchrun"``, ``"slurm"``, ``"openmpi"``,
    ``"pmi"``, ``"explicit"`` (both set as options) or ``"none"`` (one process)."""

    # Where the time goes: totals over every worker, per-sample percentiles of each stage
    # (decode and transform: image samples only), per-batch percentiles of the device copy.
    read_ns: int
    decode_ns: int
    transform_ns: int
    collate_ns: int
    h2d_ns: int
    num_workers: int
    read_ns_p50: int
    read_ns_p95: int
    decode_ns_p50: int
    decode_ns_p95: int
    transform_ns_p50: int
    transform_ns_p95: int
    collate_ns_p50: int
    collate_ns_p95: int
    h2d_ns_p50: int
    h2d_ns_p95: int
    busy_ns: int
    # The memory budget and the in-flight cap it allows (lower than requested when lowered).
    memory_budget: int
    batch_bytes: int
    in_flight_cap: int
    in_flight_cap_requested: int
    # Batches in flight per worker now, and the changes autotune made.
    prefetch_factor: int
    autotune_decisions: int
    #: Images by decode path (option ``jpeg_decoder``): whole by zune-jpeg/zune-png, whole by
    #: libjpeg-turbo, only the crop's region by libjpeg-turbo, and of those, DCT-scaled.
    decoded_zune: int
    decoded_turbo: int
    decoded_turbo_region: int
    decoded_turbo_scaled: int
    #: Batches the loader lets be in flight now (at most ``in_flight_cap``: ``num_workers + 1``
    #: at first, deeper only when the consumer's waits call for it), and the batch memory
    #: mapped now and at most so far, in bytes.
    in_flight_depth: int
    batch_memory_bytes: int
    batch_memory_peak_bytes: int
    #: Minor page faults taken by batch memory since the loader was created (mapping and
    #: pre-faulting its slabs; a reused slab takes none).
    page_faults: int
    #: Bytes copied host to device (``device="cuda"``), summed over batches; under
    #: ``gpu_normalize`` image fields cross as uint8.
    h2d_bytes: int
    #: Device memory the loader holds now (``device="cuda"``): the prefetch ring, in bytes.
    device_memory_bytes: int
    #: Images the workers left to the device's JPEG decoder (``jpeg_decoder="gpu"``).
    decoded_device: int
    #: The share of samples (by a hash of the index) the device decodes now.
    gpu_decode_share: float
    #: Time each worker spent building batches, by worker number (in start order).
    worker_busy_ns: tuple[int, ...] = ()

@dataclasses.dataclass(frozen=True)
class Launch:
    """This process's place in a distributed job, as ``launch()`` resolves it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launcher: str
    """``"torchrun"``, ``"slurm"``, ``"openmpi"``, ``"pmi"``, ``"explicit"`` or ``"none"``."""


def launch(rank: int | str | None = None, world_size: int | str | None = None) -> Launch:
    """The rank, world size, local rank and local world size a loader would have, from explicit
    values or (``None`` / ``"auto"``) the launcher's variables: torchrun, Slurm, Open MPI, PMI.
    Inconsistent variables raise ``InvalidArgumentError`` naming them."""
    opts = _ffi.lib.stoker_options_new()
    if not opts:
        raise MemoryError("stoker_options_new returned NULL")
    try:
        for key, value in (("rank", rank), ("world_size", world_size)):
            if value is not None:
                check(_ffi.lib.stoker_options_set(opts, key.encode(), option_value(value).encode()))
        raw = _ffi.LaunchInfo()
        check(_ffi.lib.stoker_options_launch(opts, ctypes.byref(raw)))
    finally:
        _ffi.lib.stoker_options_free(opts)
    return Launch(
        rank=raw.rank,
        world_size=raw.world_size,
        local_rank=raw.local_rank,
        local_world_size=raw.local_world_size,
        launcher=_ffi.LAUNCHERS.get(raw.launcher, f"unknown ({raw.launcher})"),
    )


def option_value(value: Any) -> str:
    """The string form the C ABI parses: ``True`` -> ``"true"``, ``[1, 2]`` -> ``"1,2"``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(option_value(v) for v in value)
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)
    return str(value)


def _new_loader(
    options: dict[str, str], dataset: Any, concurrent: bool, form: ItemForm
) -> int:
    opts = _ffi.lib.stoker_options_new()
    if not opts:
        raise MemoryError("stoker_options_new returned NULL")
    try:
        if dataset is not None:
            if is_iterable_source(dataset):
                set_iterable(opts, dataset, form)
            else:
                set_source(opts, dataset, concurrent, form)
        for key, value in options.items():
            check(_ffi.lib.stoker_options_set(opts, key.encode(), value.encode()))
        out = ctypes.c_void_p()
        check(_ffi.lib.stoker_loader_new(opts, ctypes.byref(out)))
        if not out.value:
            raise InternalError("stoker_loader_new reported success without a loader")
        return out.value
    finally:
        _ffi.lib.stoker_options_free(opts)


# Loaders whose workers call into Python (a dataset source). They are closed before the
# interpreter finalizes: a worker thread entering Python after that is killed by the
# interpreter in a way that aborts the process.
_python_source_loaders: weakref.WeakSet[Loader] = weakref.WeakSet()


@atexit.register
def _close_python_source_loaders() -> None:
    for loader in list(_python_source_loaders):
        loader.close()


# Every live loader, for the fork handler below.
_loaders: weakref.WeakSet[Loader] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A loader's threads do not survive fork(): in the child the library refuses every call that
    # needs them with UnsupportedError. But a parent thread may have held a loader's Python locks
    # at the moment of the fork (one waiting in next_batch, say), and would never release them
    # here; the locks are made anew so that the child's calls reach the library and its error.
    for loader in list(_loaders):
        loader._lock = threading.RLock()
        loader._ptr_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Loader:
    """A stoker loader. ``source`` is a source spec (``"npy:PATH"``, ``"image_folder:ROOT"``,
    ``"tar:train-{000..146}.tar"``), a map-style Python dataset (see ``stoker.dataset``) or an
    iterable one, a torch ``IterableDataset`` or any object with ``__iter__`` and no
    ``__len__`` (see ``stoker.iterable``); a torchvision ``ImageFolder`` without Python
    transforms is read as ``image_folder:ROOT`` (see ``stoker.vision``); ``None`` with a
    ``blend=`` of token sources. Every keyword is an option key of the C ABI (the table in
    ``docs/options.md``, and ``include/stoker.h``); ``None`` leaves the library's default.
    Options the library rejects raise ``InvalidArgumentError`` naming the key. One keyword is
    this package's: ``concurrent_getitem=True`` lets a dataset's ``__getitem__`` run on several
    worker threads at once (see ``stoker.dataset``); leave it off unless the dataset is safe to
    call so.

    ``for batch in loader:`` runs to the end of the current epoch; the next ``for`` continues
    with the next epoch (or with the rest of the epoch, after a ``break``). Batches and the
    arrays made from them stay valid after the loader is closed.

    A loader's threads do not survive ``fork()``: in a forked child (a ``multiprocessing``
    worker, a torch ``DataLoader`` worker), iterating, ``set_epoch`` and ``stats`` on a loader
    made before the fork raise :class:`UnsupportedError`, and closing it leaks it instead of
    joining threads that exist in the parent only. Make the loader in the child (lazily, in the
    dataset's ``__iter__`` or the worker's init function); the parent's loader is unaffected.

    >>> with stoker.Loader("npy:x.npy", batch_size=256, shuffle=True, seed=1) as loader:
    ...     for epoch in range(10):
    ...         for batch in loader:
    ...             x = batch["data"]          # NumPy view of the batch, no copy
    """

    _ptr = None  # so that __del__ of a half-constructed loader has nothing to free
    # Bound at class creation so that __del__ still works while the interpreter shuts down.
    _free = _ffi.lib.stoker_loader_free

    def __init__(
        self,
        source: str | os.PathLike[str] | Any | None,
        *,
        batch_size: int | None = None,
        shuffle: bool | None = None,
        transform: str | None = None,
        num_workers: int | str | None = None,
        concurrent_getitem: bool = False,
        **options: Any,
    ):
        # A torchvision folder dataset the library can read itself (see stoker.vision).
        source = native_source(source) or source
        # A blend of token sources takes the place of the source.
        is_spec = isinstance(source, (str, os.PathLike)) or (
            source is None and options.get("blend") is not None
        )
        map_style = (
            not is_iterable_source(source)
            and hasattr(source, "__len__")
            and hasattr(source, "__getitem__")
        )
        if not is_spec and not map_style and not is_iterable_source(source):
            raise TypeError(
                f"source must be a spec such as 'npy:PATH', a map-style dataset "
                f"(__len__ and __getitem__) or an iterable one (__iter__ and no __len__), "
                f"not {type(source).__name__}"
            )
        if concurrent_getitem and not map_style:
            raise TypeError("concurrent_getitem applies to a map-style dataset (__getitem__)")
        self._dataset = None if is_spec else source
        self._concurrent = bool(concurrent_getitem)
        # The form of a Python source's items, learnt from the first one read (stoker.torch
        # collates into it).
        self._item_form = ItemForm()
        options.update(
            source=source if is_spec else None,
            batch_size=batch_size,
            shuffle=shuffle,
            transform=transform,
            num_workers=num_workers,
        )
        self._options = {k: option_value(v) for k, v in options.items() if v is not None}
        # The C loader is driven by one thread at a time; `_lock` makes concurrent Python
        # callers take turns instead of racing (ctypes releases the GIL inside next()). It is
        # re-entrant: a garbage collection on the thread holding it (between library calls) may
        # finalize a stoker.torch iterator, whose cleanup moves the epoch.
        # `_ptr_lock` only guards the pointer's lifetime, so that close() from another thread
        # can wake a next() waiting under `_lock`, and stats() can read meanwhile.
        self._lock = threading.RLock()
        self._ptr_lock = threading.Lock()
        self._ptr = _new_loader(self._options, self._dataset, self._concurrent, self._item_form)
        _loaders.add(self)
        if self._dataset is not None:
            _python_source_loaders.add(self)

    @property
    def options(self) -> dict[str, str]:
        """The option keys and string values this loader was built with (a Python dataset
        source is not among them)."""
        return dict(self._options)

    def _handle(self) -> int:
        if not self._ptr:
            raise ClosedError("the loader is closed")
        return self._ptr

    def next_batch(self) -> Batch | None:
        """The next batch, or ``None`` at the end of the epoch (then the next call starts the
        next epoch)."""
        with self._lock:
            ptr = self._handle()
            epoch = _ffi.lib.stoker_loader_epoch(ptr)
            out = ctypes.c_void_p()
            status = _ffi.lib.stoker_loader_next(ptr, ctypes.byref(out))
            # Held before anything can raise, so that a batch is freed with it.
            batch = Batch(out.value, epoch) if out.value else None
            # Ctrl-C in a dataset's __getitem__ (num_workers=0 runs it on this thread) failed
            # its sample in the library; it interrupts the caller, as in torch.
            raise_interrupt()
            try:
                if check(status) == _ffi.END_OF_EPOCH:
                    return None
            except CallbackError as e:
                # The dataset's own exception, with its traceback, as the cause.
                cause = failure_in(str(e))
                if cause is None:
                    raise
                raise e from cause
            if batch is None:
                raise InternalError("stoker_loader_next reported a batch without one")
            return batch

    def __iter__(self) -> Iterator[Batch]:
        while (batch := self.next_batch()) is not None:
            yield batch

    def __len__(self) -> int:
        n = int(_ffi.lib.stoker_loader_batches_per_epoch(self._handle()))
        if n < 0:
            raise TypeError("this loader's source is a stream of unknown length: set num_samples")
        return n

    @property
    def batches_per_epoch(self) -> int | None:
        """Batches per epoch (the same on every rank), or ``None`` when unknown (an iterable
        source without ``num_samples``)."""
        n = _ffi.lib.stoker_loader_batches_per_epoch(self._handle())
        return None if n < 0 else int(n)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to (waits for a ``next_batch`` under way on another
        thread: the library answers one call at a time)."""
        with self._lock:
            return int(_ffi.lib.stoker_loader_epoch(self._handle()))

    def stats(self) -> Stats:
        """A snapshot of the loader's statistics; callable at any time, from any thread, also
        while another thread waits for a batch."""
        with self._ptr_lock:
            return self._stats(self._handle())

    def _stats(self, ptr: int) -> Stats:
        # Per-worker times first: the totals read after them are at least their sum.
        count = ctypes.c_size_t()
        check(_ffi.lib.stoker_loader_worker_busy_ns(ptr, None, 0, ctypes.byref(count)))
        busy = (ctypes.c_uint64 * max(count.value, 1))()
        check(_ffi.lib.stoker_loader_worker_busy_ns(ptr, busy, count.value, ctypes.byref(count)))
        # Workers started between the calls are left out of this snapshot.
        workers = tuple(busy[: min(count.value, len(busy))])
        raw = _ffi.Stats(size=ctypes.sizeof(_ffi.Stats))
        check(_ffi.lib.stoker_loader_stats(ptr, ctypes.byref(raw)))
        values = {
            f.name: getattr(raw, f.name)
            for f in dataclasses.fields(Stats)
            if f.name != "worker_busy_ns"
        }
        values["launcher"] = _ffi.LAUNCHERS.get(raw.launcher, f"unknown ({raw.launcher})")
        return Stats(**values, worker_busy_ns=workers)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next batch the first of ``epoch`` (``DistributedSampler.set_epoch``):
        batches being built are discarded, batches already handed out stay valid. Nothing
        changes at the start of ``epoch``, or right after resuming into it, so the usual
        ``loader.set_epoch(e)`` before each epoch continues a resumed epoch."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        with self._lock:
            check(_ffi.lib.stoker_loader_set_epoch(self._handle(), epoch))

    def state_dict(self) -> dict[str, str]:
        """Where the loader stands: ``{"state": str}``, for ``load_state_dict`` or the
        ``resume_state`` option. Batches already prefetched but not delivered are not lost."""
        with self._lock:
            ptr = self._handle()
            needed = ctypes.c_size_t()
            check(_ffi.lib.stoker_loader_save_state(ptr, None, 0, ctypes.byref(needed)))
            buf = ctypes.create_string_buffer(needed.value)
            check(_ffi.lib.stoker_loader_save_state(ptr, buf, needed.value, ctypes.byref(needed)))
        return {"state": buf.value.decode()}

    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        """Continues exactly where the saved loader stopped: rebuilds this loader with the same
        options plus ``resume_state``."""
        options = dict(self._options, resume_state=state_dict["state"])
        new = _new_loader(options, self._dataset, self._concurrent, self._item_form)
        with self._lock, self._ptr_lock:
            old, self._ptr, self._options = self._ptr, new, options
            _ffi.lib.stoker_loader_free(old)

    def close(self) -> None:
        """Stops the loader and joins its threads; callable from any thread, and more than
        once. A ``next_batch`` (or iteration) waiting for a batch in another thread raises
        :class:`ClosedError` at once; this call then frees the loader after that one has
        returned. With ``num_workers=0`` the waiting thread is building the batch itself, so
        the close takes effect when that build returns. Batches already handed out stay
        valid."""
        with self._ptr_lock:
            if self._ptr:
                _ffi.lib.stoker_loader_close(self._ptr)
        with self._lock, self._ptr_lock:
            ptr, self._ptr = self._ptr, None
            if ptr:
                _ffi.lib.stoker_loader_free(ptr)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        ptr, self._ptr = self._ptr, None
        if ptr:
            self._free(ptr)

    def __repr__(self) -> str:
        state = "closed" if not self._ptr else f"epoch={self.epoch}"
        source = self._options.get("source") or type(self._dataset).__name__
        return f"<stoker.Loader {source} {state}>"
