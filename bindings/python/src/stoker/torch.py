"""A ``torch.utils.data.DataLoader``-shaped face of ``stoker.Loader``, for porting code.

    from stoker.torch import DataLoader
    loader = DataLoader("image_folder:/data/train", batch_size=256, shuffle=True, num_workers=8,
                        transform="random_resized_crop(224) | hflip | normalize(imagenet)")
    for epoch in range(90):
        loader.set_epoch(epoch)            # as with a DistributedSampler; optional otherwise
        for images, labels in loader:      # torch tensors sharing stoker's memory (DLPack)
            ...

It takes torch's whole ``DataLoader`` signature, so porting code can pass its arguments
verbatim; each one is mapped to stoker's options or refused with a message saying what to use:

* ``sampler`` / ``batch_sampler``: torch's own samplers are read (``DistributedSampler``'s
  ``num_replicas``, ``rank``, ``shuffle``, ``seed``, ``drop_last``; ``RandomSampler``,
  ``SubsetRandomSampler``, ``WeightedRandomSampler(replacement=True)``, ``SequentialSampler``,
  ``BatchSampler``), and a sequence of indices is the order of every epoch; a custom sampler
  object, or a subclass of torch's with its own ``__iter__``, is refused (stoker draws the
  order in the library); any sampler but ``DistributedSampler`` reads the whole dataset on every
  rank, as in torch;
* ``timeout`` (seconds) is ``timeout_ms``, refused with ``num_workers=0`` (where torch ignores it:
  the batch is built on the calling thread); ``generator`` seeds the order in a one-process job;
* ``collate_fn`` other than torch's default is refused (batches are collated in the library);
* ``worker_init_fn``, ``multiprocessing_context``, ``persistent_workers`` and
  ``pin_memory_device`` are accepted and change nothing: workers are threads of this process,
  they always persist, and every random choice is keyed by (seed, epoch, draw), not by a
  per-worker seed.

Distributed jobs (torchrun, Slurm, MPI): the rank and world size come from the launcher's
variables (or ``rank=`` / ``num_replicas=``); the epoch's order depends only on the shared seed,
so ranks agree by construction. With more than one rank the default seed is fixed (0, as
``DistributedSampler``'s), never drawn from a rank's own RNG. ``state_dict()`` is the same on
every rank and resumes at any world size.

Other differences from torch: the dataset is a stoker source spec (``image_folder:ROOT``,
``npy:PATH``) or a dataset whose items stoker can take (see ``stoker.dataset``: PIL images and
pixel arrays of varying size included, when ``transform`` fixes the output size), and
augmentation is a ``transform`` spec run inside stoker, not Python callables. A torchvision
``ImageFolder`` with no Python ``transform`` is read natively, as ``image_folder:ROOT`` (see
``stoker.vision``); docs/porting.md walks through porting a torch input pipeline.
"""

from __future__ import annotations

import collections.abc
import contextlib
import operator
from typing import Any, Iterator

import torch
import torch.utils.data as tud

from .errors import ClosedError, UnsupportedError
from .loader import Loader, launch

def _indices(name: str, seq: Any) -> list[int]:
    """A sequence of dataset indices (list, tuple, range, 1-D array or tensor) as ints."""
    if isinstance(seq, torch.Tensor):
        if seq.dim() != 1 or seq.is_floating_point():
            raise TypeError(f"{name}: a tensor of indices must be 1-D integers")
        return [int(i) for i in seq.tolist()]
    out = []
    for i in seq:
        try:
            if isinstance(i, bool):
                raise TypeError
            out.append(operator.index(i))
        except TypeError:
            raise TypeError(f"{name}: {i!r} is not an index") from None
    return out


def _is(obj: Any, cls: type) -> bool:
    """Whether ``obj`` is a ``cls`` whose order is ``cls``'s own: a subclass that draws its
    own (its ``__iter__``) cannot be read as ``cls``'s options."""
    own = getattr(type(obj), "__iter__", None)
    return isinstance(obj, cls) and own is getattr(cls, "__iter__", None)


def _sampler_options(sampler: Any) -> dict[str, Any]:
    """stoker options equivalent to a torch sampler object or an index sequence. A sampler
    that is not a DistributedSampler reads the whole dataset on every rank, as in torch."""
    kind = type(sampler).__name__
    whole = {"world_size": 1, "rank": 0}
    if _is(sampler, tud.distributed.DistributedSampler):
        return {
            "world_size": sampler.num_replicas,
            "rank": sampler.rank,
            "shuffle": sampler.shuffle,
            "seed": sampler.seed,
            "shard_drop_last": sampler.drop_last,
            "_epoch": getattr(sampler, "epoch", 0),
        }
    if _is(sampler, tud.SequentialSampler):
        return whole
    if _is(sampler, tud.RandomSampler):
        out: dict[str, Any] = {"shuffle": True, "replacement": sampler.replacement, **whole}
        if sampler._num_samples is not None:
            out["num_samples"] = sampler._num_samples
        if sampler.generator is not None:
            out["_generator"] = sampler.generator
        return out
    if _is(sampler, tud.SubsetRandomSampler):
        out = {"subset": _indices("sampler", sampler.indices), **whole}
        if sampler.generator is not None:
            out["_generator"] = sampler.generator
        return out
    if _is(sampler, tud.WeightedRandomSampler):
        if not sampler.replacement:
            raise ValueError(
                "WeightedRandomSampler(replacement=False) has no stoker option: pass "
                "replacement=True, or draw the indices yourself and pass them as sampler=[...]"
            )
        out = {
            "weights": [float(w) for w in sampler.weights.tolist()],
            "num_samples": sampler.num_samples,
            **whole,
        }
        if sampler.generator is not None:
            out["_generator"] = sampler.generator
        return out
    if isinstance(sampler, (collections.abc.Sequence, range, torch.Tensor)) or (
        type(sampler).__module__ == "numpy" and getattr(sampler, "ndim", None) == 1
    ):
        return {"indices": _indices("sampler", sampler), **whole}
    raise TypeError(
        f"sampler={kind} cannot be mapped: stoker draws each epoch's order in the library "
        "(a subclass of torch's samplers with its own __iter__ included). Pass "
        "the indices as a sequence (the order of every epoch), one of torch's samplers, or "
        "stoker's options shuffle=, replacement=, num_samples=, weights=, subset="
    )


def _check_sampler_dataset(sampler: Any, dataset: Any) -> None:
    """Refuses a sampler made over a dataset of another length than the loader's: torch deals
    that dataset's indices (`range(len(sampler.dataset))`), which stoker's options cannot say."""
    of = getattr(sampler, "dataset", None)
    if of is None:
        of = getattr(sampler, "data_source", None)
    if of is None or isinstance(dataset, (str, bytes)) or not hasattr(dataset, "__len__"):
        return
    theirs, ours = len(of), len(dataset)
    if theirs != ours:
        raise ValueError(
            f"sampler={type(sampler).__name__} was made over a dataset of {theirs} samples, but "
            f"the loader's has {ours}: torch would deal indices 0..{theirs - 1} of it. Give "
            "both the same dataset, or restrict the loader's with subset= or indices="
        )


def _batch_sampler_options(batch_sampler: Any) -> dict[str, Any]:
    """stoker options (with batch_size and drop_last) equivalent to a batch sampler."""
    if _is(batch_sampler, tud.BatchSampler):
        out = _sampler_options(batch_sampler.sampler)
        out.update(batch_size=batch_sampler.batch_size, drop_last=batch_sampler.drop_last)
        return out
    if isinstance(batch_sampler, collections.abc.Sequence):
        batches = [_indices("batch_sampler", b) for b in batch_sampler]
        if not batches or not batches[0]:
            raise ValueError("batch_sampler: no batches, or an empty first batch")
        size = len(batches[0])
        if any(len(b) != size for b in batches[:-1]) or len(batches[-1]) > size:
            raise ValueError(
                "batch_sampler: stoker batches are of one size (the last may be short); give "
                "batches of equal length, or sampler=[...] with batch_size="
            )
        return {
            "indices": [i for b in batches for i in b],
            "batch_size": size,
            "drop_last": False,
            "world_size": 1,
            "rank": 0,
        }
    raise TypeError(
        f"batch_sampler={type(batch_sampler).__name__} cannot be mapped: pass torch's "
        "BatchSampler (not a subclass with its own __iter__), a list of index lists of one "
        "length, or sampler= with batch_size="
    )


def _collated(fields: dict[str, torch.Tensor], form: str | None) -> Any:
    """A batch's tensors in the form torch's ``default_collate`` gives a batch of items of
    ``form`` (see ``stoker.dataset.ItemForm``): a dict for dict items, the tensor for items of
    one value, else a list in field order (as for ``(x, label)`` tuples)."""
    if form == "mapping":
        return fields
    values = list(fields.values())
    if form == "single" and len(values) == 1:
        return values[0]
    return values


class DataLoader:
    """Yields each batch as torch's ``default_collate`` would collate the dataset's items: a
    dict of tensors for a dataset of dicts, one tensor for a dataset of single values, else a
    list of tensors in the source's field order: ``[images, labels]`` for ``image_folder`` or
    a dataset of ``(image, label)`` pairs, ``[data, labels]`` for ``npy`` with ``labels=``.

    The parameters are torch's ``DataLoader``'s (see the module docstring for how each maps),
    then the ``DistributedSampler`` spellings ``num_replicas``, ``rank``, ``seed`` and
    ``shard_drop_last`` (its ``drop_last``; this ``drop_last`` is the batch one), then any
    stoker option (``transform=``, ``labels=``, ...)."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        shard_drop_last: bool | None = None,
        **options: Any,
    ):
        if collate_fn is not None and collate_fn not in (
            tud.default_collate,
            getattr(tud.dataloader, "default_collate", None),
        ):
            raise ValueError(
                "collate_fn: stoker collates in the library, writing each sample into the batch "
                "(zero copy); apply your function to the tensors each step yields, or use "
                "pad= (padded, with NAME_lengths) or ragged='offsets' (flat, with "
                "NAME_offsets) for variable-length fields"
            )
        if timeout < 0:
            raise ValueError(f"timeout option should be non-negative, not {timeout}")
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers option should be a non-negative integer, not {num_workers}")
        # worker_init_fn and multiprocessing_context are moot with threads: workers share this
        # process (no per-worker initialisation or start method), always persist, and draw no
        # per-worker seeds. They are kept as attributes only.

        mapped: dict[str, Any] = {}
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, "
                    "sampler, and drop_last"
                )
            _check_sampler_dataset(getattr(batch_sampler, "sampler", None), dataset)
            mapped = _batch_sampler_options(batch_sampler)
        else:
            if batch_size is None:
                raise ValueError(
                    "batch_size=None (unbatched samples) is not supported: stoker always "
                    "batches; use batch_size=1 and take element [0]"
                )
            # torch's BatchSampler checks, so that what torch refuses is refused here too.
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
                raise ValueError(
                    "batch_size should be a positive integer value, but got "
                    f"batch_size={batch_size}"
                )
            if not isinstance(drop_last, bool):
                raise ValueError(
                    f"drop_last should be a boolean value, but got drop_last={drop_last}"
                )
            if sampler is not None:
                if shuffle:
                    raise ValueError("sampler option is mutually exclusive with shuffle")
                _check_sampler_dataset(sampler, dataset)
                mapped = _sampler_options(sampler)
            mapped.setdefault("batch_size", batch_size)
            mapped.setdefault("drop_last", drop_last)
        sampler_epoch = mapped.pop("_epoch", 0)
        generator = mapped.pop("_generator", generator)
        for key, value in (
            ("world_size", num_replicas),
            ("rank", rank),
            ("seed", seed),
            ("shard_drop_last", shard_drop_last),
        ):
            if value is not None:
                mapped[key] = value
        if shuffle and "indices" not in mapped:
            mapped.setdefault("shuffle", True)
        mapped.update(options)

        random_order = any(
            mapped.get(k) for k in ("shuffle", "replacement", "subset", "weights")
        ) or "num_samples" in mapped
        if mapped.get("seed") is None and random_order:
            where = launch(rank=mapped.get("rank"), world_size=mapped.get("world_size"))
            if where.world_size > 1:
                # Ranks agree by construction: a fixed seed, as DistributedSampler's, never a
                # rank's own RNG (ranks seeded `seed + rank` would read overlapping shards).
                mapped["seed"] = 0
            else:
                draw = torch.empty((), dtype=torch.int64)
                draw.random_(generator=generator) if generator is not None else draw.random_()
                mapped["seed"] = int(draw.item()) & (2**63 - 1)

        # torch's attributes, as given (training scripts read `loader.dataset`,
        # `loader.sampler.set_epoch`, `loader.batch_size`).
        self.dataset = dataset
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.batch_size = mapped.get("batch_size")
        self.drop_last = mapped.get("drop_last")
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        self.pin_memory_device = pin_memory_device
        self.in_order = in_order
        self._loader = Loader(
            dataset,
            num_workers=num_workers,
            pin_memory=pin_memory,
            prefetch_factor=prefetch_factor,
            in_order=in_order,
            timeout_ms=round(timeout * 1000) if timeout else None,
            **mapped,
        )
        self._in_epoch = False
        # Which iteration is the live one: a new `iter()` ends the one before.
        self._iteration = 0
        if sampler_epoch:
            self.set_epoch(sampler_epoch)

    def __iter__(self) -> Iterator[Any]:
        """One whole epoch, like torch: an epoch left unfinished (``break``) is not read further,
        so every ``for`` starts at the beginning of the next epoch, and a ``state_dict()`` saved
        after the ``break`` resumes there. One iteration at a time: a
        new ``iter()`` ends the one before, whose next step raises ``RuntimeError``."""
        if self._in_epoch:
            self._loader.set_epoch(self._loader.epoch + 1)
        self._iteration += 1
        iteration = self._iteration
        self._in_epoch = True
        try:
            while True:
                if self._iteration != iteration:
                    raise RuntimeError(
                        "this DataLoader started another iteration (iter() again) before this "
                        "one ended; stoker's DataLoader runs one at a time over one set of "
                        "threads: make a second DataLoader to read two at once"
                    )
                batch = self._loader.next_batch()
                if batch is None:
                    break
                yield _collated(batch.torch(), self._loader._item_form.kind)
        except GeneratorExit:
            # The `for` was left (break, return, an exception in its body): the epoch is
            # abandoned now, so that a state saved before the next `for` resumes at the next
            # epoch's start, where that `for` would have begun.
            if self._iteration == iteration and self._in_epoch:
                self._in_epoch = False
                # A closed loader (or one in a forked child) has no position to move.
                with contextlib.suppress(ClosedError, UnsupportedError):
                    self._loader.set_epoch(self._loader.epoch + 1)
            raise
        self._in_epoch = False

    def __len__(self) -> int:
        return len(self._loader)

    def set_epoch(self, epoch: int) -> None:
        """``DistributedSampler.set_epoch``: the next ``for`` runs epoch ``epoch`` from its first
        batch (work in flight for another epoch is discarded). A no-op at the start of that
        epoch, or right after ``load_state_dict`` into it, so the usual loop resumes exactly."""
        self._loader.set_epoch(epoch)
        self._in_epoch = False

    @property
    def loader(self) -> Loader:
        """The underlying ``stoker.Loader`` (stats, epoch, close)."""
        return self._loader

    def state_dict(self) -> dict[str, str]:
        """The job's position: the same on every rank, resumable at any world size (with
        ``in_order=False``, each rank's own, resumable by that rank at the same world size)."""
        return self._loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        """Continues exactly where the saved loader stopped, mid-epoch included."""
        self._loader.load_state_dict(state_dict)
        # A saved state may stand mid-epoch; the next `for` continues from there.
        self._in_epoch = False
