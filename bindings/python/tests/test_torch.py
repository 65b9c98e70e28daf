"""Torch tensors through DLPack: no copy, right dtypes, valid after batch and loader are gone."""

import gc

import numpy as np
import pytest
from _optional import import_torch

torch = import_torch()


def test_torch_tensors_share_the_batch_memory(make_loader, npy_data):
    batch = next(iter(make_loader()))
    tensors = batch.torch()
    assert set(tensors) == {"data", "label"}
    assert tensors["data"].dtype == torch.uint8 and tensors["label"].dtype == torch.int64
    assert tensors["data"].data_ptr() == batch["data"].ctypes.data
    np.testing.assert_array_equal(tensors["data"].numpy(), npy_data[2][:16])


def test_from_dlpack_on_a_field(make_loader):
    batch = next(iter(make_loader()))
    field = batch.dlpack("label")
    assert field.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(field)
    assert t.data_ptr() == batch["label"].ctypes.data


def test_tensors_outlive_batch_and_loader(make_loader, npy_data):
    loader = make_loader(num_workers=2)
    kept = [b.torch()["data"] for b in loader]
    loader.close()
    del loader
    gc.collect()
    for k, t in enumerate(kept):
        np.testing.assert_array_equal(t.numpy(), npy_data[2][16 * k : 16 * (k + 1)])


def test_unconsumed_capsule_frees_its_export(make_loader):
    batch = next(iter(make_loader()))
    for _ in range(1000):
        capsule = batch.dlpack("data").__dlpack__(max_version=(1, 0))
        del capsule  # the capsule destructor runs the export's deleter
    gc.collect()


def test_consumer_without_versioned_dlpack_is_refused(make_loader):
    batch = next(iter(make_loader()))
    with pytest.raises(BufferError):
        batch.dlpack("data").__dlpack__()


def test_dataloader_adapter_yields_tensor_lists(npy_data):
    from stoker.torch import DataLoader

    data_path, labels_path, data, labels = npy_data
    loader = DataLoader(
        f"npy:{data_path}", labels=f"npy:{labels_path}", batch_size=16, num_workers=2,
        drop_last=True, prefetch_factor=2, persistent_workers=True,
    )
    assert len(loader) == len(data) // 16
    batches = list(loader)
    assert len(batches) == len(loader)
    x, y = batches[1]
    assert isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and y.dtype == torch.int64
    np.testing.assert_array_equal(x.numpy(), data[16:32])
    np.testing.assert_array_equal(y.numpy(), labels[16:32])


def test_dataloader_adapter_every_for_is_a_whole_epoch(npy_data):
    from stoker.torch import DataLoader

    data_path, _, data, _ = npy_data
    loader = DataLoader(f"npy:{data_path}", batch_size=16)
    for k, (x,) in enumerate(loader):
        if k == 1:
            break
    first = [x for (x,) in loader]
    assert len(first) == len(loader)
    np.testing.assert_array_equal(first[0].numpy(), data[:16])
    assert loader.loader.epoch == 2


def test_dataloader_adapter_shuffle_follows_torch_manual_seed(npy_data):
    from stoker.torch import DataLoader

    def first_batch():
        return next(iter(DataLoader(f"npy:{npy_data[0]}", batch_size=16, shuffle=True)))[0]

    torch.manual_seed(1)
    a = first_batch()
    torch.manual_seed(1)
    assert torch.equal(a, first_batch())
    torch.manual_seed(2)
    assert not torch.equal(a, first_batch())


def test_dataloader_takes_torchs_whole_signature(npy_data):
    """Every parameter of torch's DataLoader is a parameter here, and torch's defaults work."""
    import inspect

    from stoker.torch import DataLoader

    theirs = inspect.signature(torch.utils.data.DataLoader.__init__).parameters
    ours = inspect.signature(DataLoader.__init__).parameters
    missing = [name for name in theirs if name not in ours]
    assert not missing, f"torch's DataLoader takes {missing}, stoker's does not"
    data_path, labels_path, data, labels = npy_data
    defaults = {
        name: p.default for name, p in theirs.items()
        if name not in ("self", "dataset") and p.default is not inspect.Parameter.empty
    }
    loader = DataLoader(f"npy:{data_path}", labels=f"npy:{labels_path}", **defaults)
    assert len(loader) == len(data)
    # And every one given explicitly, as porting code passes them.
    g = torch.Generator().manual_seed(3)
    loader = DataLoader(
        f"npy:{data_path}", batch_size=10, shuffle=True, sampler=None, batch_sampler=None,
        num_workers=2, collate_fn=None, pin_memory=False, drop_last=True, timeout=30,
        worker_init_fn=lambda worker_id: None, multiprocessing_context="spawn", generator=g,
        prefetch_factor=2, persistent_workers=True, pin_memory_device="", in_order=True,
        labels=f"npy:{labels_path}",
    )
    assert loader.loader.options["timeout_ms"] == "30000"
    assert len(loader) == len(data) // 10
    got = sorted(int(i) for _, y in loader for i in y)
    assert len(got) == 100 and len(set(got)) == 100
    # The generator seeds the order: the same generator state, the same order.
    again = DataLoader(f"npy:{data_path}", labels=f"npy:{labels_path}", batch_size=10,
                       shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(3))
    first = [y.tolist() for _, y in DataLoader(
        f"npy:{data_path}", labels=f"npy:{labels_path}", batch_size=10, shuffle=True,
        drop_last=True, generator=torch.Generator().manual_seed(3))]
    assert [y.tolist() for _, y in again] == first


def test_dataloader_maps_torchs_samplers_and_index_sequences(npy_data):
    from stoker.torch import DataLoader
    from torch.utils.data import BatchSampler, DistributedSampler, SequentialSampler

    data_path, labels_path, data, labels = npy_data
    src, lab = f"npy:{data_path}", f"npy:{labels_path}"
    # A sequence is the order of every epoch.
    order = [5, 3, 3, 90, 0]
    loader = DataLoader(src, labels=lab, sampler=order, batch_size=2)
    for _ in range(2):
        assert [int(i) for _, y in loader for i in y] == [int(labels[i]) for i in order]
    # Batches given as lists of indices.
    loader = DataLoader(src, labels=lab, batch_sampler=[[1, 2], [7, 8], [4]])
    assert [y.tolist() for _, y in loader] == [
        labels[[1, 2]].tolist(), labels[[7, 8]].tolist(), labels[[4]].tolist()]
    # torch's BatchSampler over its SequentialSampler.
    loader = DataLoader(src, labels=lab,
                        batch_sampler=BatchSampler(SequentialSampler(range(len(data))), 16, True))
    assert len(loader) == len(data) // 16
    # DistributedSampler: its num_replicas, rank, shuffle, seed, drop_last, epoch.
    ds = DistributedSampler(range(len(data)), num_replicas=3, rank=1, shuffle=True, seed=7)
    ds.set_epoch(2)
    via_sampler = DataLoader(src, labels=lab, sampler=ds, batch_size=8)
    via_args = DataLoader(src, labels=lab, num_replicas=3, rank=1, seed=7, shuffle=True,
                          batch_size=8)
    via_args.set_epoch(2)
    assert via_sampler.loader.epoch == 2
    assert [y.tolist() for _, y in via_sampler] == [y.tolist() for _, y in via_args]
    assert len(via_sampler) == 5  # ceil(103 / 3) = 35 samples per rank, in batches of 8
    # A sampler over a dataset of another length deals other indices in torch: refused.
    dataset = Items("pair")
    for sampler in [DistributedSampler(range(4), num_replicas=2, rank=0),
                    SequentialSampler(range(9))]:
        with pytest.raises(ValueError, match="dataset of (4|9) samples, but the loader's has 6"):
            DataLoader(dataset, sampler=sampler)
    with pytest.raises(ValueError, match="of 9 samples, but the loader's has 6"):
        DataLoader(dataset, batch_sampler=BatchSampler(SequentialSampler(range(9)), 2, False))


def test_dataloader_refuses_what_it_cannot_map_and_says_what_to_use(npy_data):
    from stoker.torch import DataLoader
    from torch.utils.data import Sampler, WeightedRandomSampler

    data_path, _, data, _ = npy_data
    src = f"npy:{data_path}"

    class Custom(Sampler):
        def __iter__(self):
            return iter(range(3))

        def __len__(self):
            return 3

    class Reversed(torch.utils.data.SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    class Buckets(torch.utils.data.BatchSampler):
        def __iter__(self):
            return iter([[3, 2, 1], [0, 4, 5]])

    for kwargs, match in [
        ({"sampler": Custom()}, "as a sequence"),
        # A subclass of torch's that draws its own order is a custom sampler too.
        ({"sampler": Reversed(data)}, "own __iter__"),
        ({"batch_sampler": Buckets(range(6), 3, False)}, "own __iter__"),
        ({"collate_fn": lambda batch: batch}, "collates in the library"),
        ({"batch_size": None}, "batch_size=1"),
        ({"sampler": [1, 2], "shuffle": True}, "mutually exclusive"),
        ({"batch_sampler": [[1, 2], [3]], "batch_size": 4}, "mutually exclusive"),
        ({"batch_sampler": [[1], [2, 3]]}, "equal length"),
        ({"sampler": WeightedRandomSampler([1.0] * len(data), 10, replacement=False)},
         "replacement=True"),
        ({"timeout": -1}, "non-negative"),
    ]:
        with pytest.raises((TypeError, ValueError), match=match):
            DataLoader(src, **kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"batch_size": "4"}, {"batch_size": 0}, {"batch_size": True}, {"drop_last": 1}]
)
def test_dataloader_refuses_the_batch_arguments_torch_refuses_in_its_words(kwargs):
    from stoker.torch import DataLoader

    with pytest.raises(ValueError) as theirs:
        torch.utils.data.DataLoader(range(8), **kwargs)
    with pytest.raises(ValueError) as ours:
        DataLoader(range(8), **kwargs)
    assert str(ours.value) == str(theirs.value)


class Items:
    """A map-style dataset whose items are of one ``form``: one array, an ``(x, label)`` pair
    or a dict."""

    def __init__(self, form):
        self.form = form

    def __len__(self):
        return 6

    def __getitem__(self, i):
        x = np.arange(3, dtype=np.float32) + i
        return {"single": x, "pair": (x, i), "mapping": {"x": x, "y": i}}[self.form]


def same_batches(ours, theirs):
    """Batches of one structure (tensor, list or dict of tensors) and equal tensors."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert type(a) is type(b), (type(a), type(b))
        if isinstance(b, dict):
            assert list(a) == list(b)
            a, b = list(a.values()), list(b.values())
        elif isinstance(b, torch.Tensor):
            a, b = [a], [b]
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert x.dtype == y.dtype and torch.equal(x, y), (x, y)


@pytest.mark.parametrize("form", ["single", "pair", "mapping"])
def test_dataloader_batches_come_in_the_form_torch_collates_the_items_into(form):
    """A dataset of dicts gives dicts, one of single arrays gives tensors, one of pairs gives
    lists: what torch's DataLoader yields for the same dataset, whatever num_workers."""
    from stoker.torch import DataLoader

    theirs = list(torch.utils.data.DataLoader(Items(form), batch_size=4))
    for workers in [0, 2]:
        same_batches(list(DataLoader(Items(form), batch_size=4, num_workers=workers)), theirs)


def test_an_iterable_dataset_with_a_len_is_read_as_the_stream_it_is():
    """torch takes an IterableDataset's __len__ as a hint and iterates it; so does stoker,
    rather than calling the __getitem__ it does not have."""
    from stoker.torch import DataLoader

    class Stream(torch.utils.data.IterableDataset):
        def __len__(self):
            return 6

        def __iter__(self):
            return iter(Items("pair")[i] for i in range(6))

    theirs = list(torch.utils.data.DataLoader(Stream(), batch_size=4))
    same_batches(list(DataLoader(Stream(), batch_size=4, num_workers=2)), theirs)


def test_dataloader_never_draws_per_rank_seeds(npy_data):
    """Ranks whose torch RNGs differ get disjoint shares of one order (world_size > 1)."""
    from stoker.torch import DataLoader

    data_path, labels_path, data, _ = npy_data
    shares = []
    for rank in range(2):
        torch.manual_seed(100 + rank)  # the `seed + rank` habit
        loader = DataLoader(f"npy:{data_path}", labels=f"npy:{labels_path}", shuffle=True,
                            batch_size=8, num_replicas=2, rank=rank)
        assert loader.loader.options["seed"] == "0", "DistributedSampler's fixed default"
        shares.append([int(i) for _, y in loader for i in y])
    assert len(set(shares[0]) & set(shares[1])) <= 1, "at most the padding repeats"
    assert len(set(shares[0]) | set(shares[1])) == len(data)


def test_dataloader_set_epoch_and_resume(npy_data):
    from stoker.torch import DataLoader

    data_path, labels_path, _, _ = npy_data
    make = lambda: DataLoader(f"npy:{data_path}", labels=f"npy:{labels_path}", shuffle=True,
                              seed=4, batch_size=16, num_replicas=2, rank=0)
    reference = make()
    epochs = [[y.tolist() for _, y in reference] for _ in range(3)]
    loader = make()
    loader.set_epoch(2)
    assert [y.tolist() for _, y in loader] == epochs[2]
    # Stop mid-epoch 1, resume, and the usual set_epoch loop continues the epoch.
    loader = make()
    loader.set_epoch(1)
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(2)]
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    assert head + [y.tolist() for _, y in resumed] == epochs[1]


def test_a_state_saved_after_a_break_resumes_where_the_next_for_begins(npy_data):
    """A `for` left by `break` abandons its epoch (as torch's does); a state saved then resumes
    at the next epoch's start, where the next `for` begins, not in the abandoned epoch."""
    from stoker.torch import DataLoader

    data_path, labels_path, _, _ = npy_data
    make = lambda: DataLoader(f"npy:{data_path}", labels=f"npy:{labels_path}", shuffle=True,
                              seed=4, batch_size=16)
    reference = make()
    epochs = [[y.tolist() for _, y in reference] for _ in range(3)]
    loader = make()
    for step, _ in enumerate(loader):
        if step == 2:
            break
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    for after_break in [resumed, loader]:
        assert [[y.tolist() for _, y in after_break] for _ in range(2)] == epochs[1:]


def test_pin_memory_is_what_torch_calls_pinned(npy_data):
    """With a CUDA driver, pin_memory=True registers batch memory with it: torch sees the tensors
    as pinned and `.cuda(non_blocking=True)` copies asynchronously, as from torch's own
    pin_memory. Without one it is mlock, which torch does not count (checked: batches come)."""
    torch = import_torch()
    from stoker.torch import DataLoader

    data, _, array, _ = npy_data
    loader = DataLoader(f"npy:{data}", batch_size=16, pin_memory=True)
    (host,) = next(iter(loader))
    np.testing.assert_array_equal(host.numpy(), array[:16])
    if not torch.cuda.is_available():
        pytest.skip("SKIPPED, needs a GPU: no CUDA device here, so pin_memory is mlock, which torch does not count as pinned")
    assert host.is_pinned()
    on_device = host.cuda(non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(on_device.cpu(), host)


def test_dataloader_samplers_other_than_distributed_read_everything_under_a_launcher(
    npy_data, monkeypatch
):
    """Under torchrun, torch's DataLoader with a SequentialSampler (or any but a
    DistributedSampler) gives every rank the whole dataset: a rank-0 evaluation loop, say."""
    from stoker.torch import DataLoader
    from torch.utils.data import RandomSampler, SequentialSampler

    data_path, labels_path, data, labels = npy_data
    for key, value in [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"),
                       ("LOCAL_WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "x")]:
        monkeypatch.setenv(key, value)
    src = f"npy:{data_path}"
    for sampler in [SequentialSampler(data), RandomSampler(data), list(range(len(data)))]:
        loader = DataLoader(src, labels=f"npy:{labels_path}", batch_size=16, sampler=sampler)
        assert sorted(int(i) for _, y in loader for i in y) == sorted(labels.tolist()), sampler
        assert loader.sampler is sampler
    # Without a sampler the launcher's rank reads its share, as documented.
    loader = DataLoader(src, labels=f"npy:{labels_path}", batch_size=16)
    assert len([i for _, y in loader for i in y]) == (len(data) + 1) // 2


def test_dataloader_break_reads_no_further_and_one_iteration_runs_at_a_time():
    from stoker.torch import DataLoader

    class Counted:
        def __init__(self):
            self.calls = 0

        def __len__(self):
            return 2000

        def __getitem__(self, i):
            self.calls += 1
            return np.full(2, i, np.float32), i

    dataset = Counted()
    loader = DataLoader(dataset, batch_size=10, num_workers=2, prefetch_factor=2)
    assert loader.dataset is dataset and loader.num_workers == 2
    for step, _ in enumerate(loader):
        if step == 2:
            break
    # The next `for` starts the next epoch without reading the rest of this one.
    _, labels = next(iter(loader))
    assert labels.tolist() == list(range(10))
    assert dataset.calls < 300, dataset.calls
    # That iterator, dropped, abandoned epoch 1 in turn: the next batch is epoch 2's first.
    assert loader.loader.epoch == 2

    # A second iterator ends the first, which says so rather than share its batches.
    outer = iter(loader)
    next(outer)
    next(iter(loader))
    with pytest.raises(RuntimeError, match="another iteration"):
        next(outer)
