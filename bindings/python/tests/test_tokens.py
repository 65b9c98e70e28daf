"""Token streams: Megatron indexed datasets and flat token files, checked token for token
against NumPy; global batches the same at every world size; resume at another world size;
bad files named at open.

``write_megatron`` writes ``.idx``/``.bin`` pairs following the layout Megatron-LM's
``_IndexWriter`` writes (magic, version, type code, sequence count, document index entries, int32
lengths, int64 byte offsets, int64 document index); one test reads what megatron-core's own
``IndexedDatasetBuilder`` writes.
"""

import struct

import numpy as np
import pytest

import stoker

SEQ = 5


def write_megatron(prefix, docs, dtype=np.uint16):
    code = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}[np.dtype(dtype)]
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    size = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * size)])
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(np.arange(len(docs) + 1, dtype="<i8").tobytes())
    np.concatenate(docs).astype(np.dtype(dtype).newbyteorder("<")).tofile(f"{prefix}.bin")


def documents(n, base):
    rng = np.random.default_rng(base)
    return [base + 100 * d + np.arange(rng.integers(2, 19)) for d in range(n)]


def reference(docs, seq=SEQ):
    """Windows, position ids and cu_seqlens computed from the documents with NumPy."""
    tokens = np.concatenate(docs)
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])[:-1]])
    n = (len(tokens) - 1) // seq
    first = np.arange(n) * seq
    window = tokens[first[:, None] + np.arange(seq + 1)]
    t = first[:, None] + np.arange(seq)
    doc_start = starts[np.searchsorted(starts, t, side="right") - 1]
    positions = t - np.maximum(doc_start, first[:, None])
    cu = [
        np.concatenate([[0], starts[(starts > s) & (starts < s + seq)] - s, [seq]]) for s in first
    ]
    return window[:, :-1], window[:, 1:], positions, cu


@pytest.fixture
def megatron(tmp_path):
    docs = documents(30, 1000)
    write_megatron(tmp_path / "web", docs[:20])
    write_megatron(tmp_path / "more", docs[20:], dtype=np.int32)
    spec = f"megatron:{tmp_path / 'web'},{tmp_path / 'more'}"
    return spec, docs


def test_megatron_windows_equal_numpy(megatron):
    spec, docs = megatron
    inputs, labels, positions, cu = reference(docs)
    loader = stoker.Loader(
        spec, seq_len=SEQ, document_boundaries="reset", batch_size=4, num_workers=2
    )
    i = 0
    for batch in loader:
        assert batch["input_ids"].dtype == np.int64
        assert batch["cu_seqlens"].dtype == np.int32
        for k in range(batch.size):
            np.testing.assert_array_equal(batch["input_ids"][k], inputs[i])
            np.testing.assert_array_equal(batch["labels"][k], labels[i])
            np.testing.assert_array_equal(batch["position_ids"][k], positions[i])
            n = int(batch["cu_seqlens_lengths"][k])
            np.testing.assert_array_equal(batch["cu_seqlens"][k][:n], cu[i])
            assert (batch["cu_seqlens"][k][n:] == SEQ).all()
            i += 1
    assert i == len(inputs) // 4 * 4


def test_datasets_megatron_core_writes_are_read_token_exact(tmp_path):
    """megatron-core's own writer (``IndexedDatasetBuilder``), some documents split into several
    sequences as ``preprocess_data.py --split-sentences`` writes them; megatron-core's reader
    (``IndexedDataset``) sees the same tokens."""
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    docs = documents(40, 3000)
    for name, dtype in [("web", np.uint16), ("code", np.int32)]:
        builder = IndexedDatasetBuilder(str(tmp_path / f"{name}.bin"), dtype=dtype)
        for k, d in enumerate(docs):
            # Every third document as two sentences: one document, two sequences.
            lengths = [len(d) // 2, len(d) - len(d) // 2] if k % 3 == 0 else [len(d)]
            builder.add_document(torch.from_numpy(d.astype(np.int64)), lengths)
        builder.finalize(str(tmp_path / f"{name}.idx"))
        theirs = IndexedDataset(str(tmp_path / name))
        np.testing.assert_array_equal(np.concatenate([theirs[i] for i in range(len(theirs))]), np.concatenate(docs))

    inputs, labels, positions, cu = reference(docs + docs)
    loader = stoker.Loader(
        f"megatron:{tmp_path / 'web'},{tmp_path / 'code'}",
        seq_len=SEQ,
        document_boundaries="reset",
        batch_size=len(inputs),
        num_workers=0,
    )
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["input_ids"], inputs)
    np.testing.assert_array_equal(batch["labels"], labels)
    np.testing.assert_array_equal(batch["position_ids"], positions)
    for k in range(batch.size):
        n = int(batch["cu_seqlens_lengths"][k])
        np.testing.assert_array_equal(batch["cu_seqlens"][k][:n], cu[k])


def test_flat_npy_tokens_in_int32(tmp_path):
    docs = documents(12, 7)
    tokens = np.concatenate(docs)
    np.save(tmp_path / "shard-0.npy", tokens[:60].astype(np.uint32))
    np.save(tmp_path / "shard-1.npy", tokens[60:].astype(np.uint32))
    loader = stoker.Loader(
        f"tokens:{tmp_path}/shard-{{0..1}}.npy",
        seq_len=SEQ,
        token_output_dtype="int32",
        batch_size=1,
        num_workers=0,
    )
    got = np.concatenate([b["input_ids"] for b in loader])
    assert got.dtype == np.int32
    want = tokens[: len(got) * SEQ].reshape(-1, SEQ)
    np.testing.assert_array_equal(got, want)


def global_batches(spec, world, batch, steps, state=None):
    """The union of every rank's micro-batches, step by step, and the ranks' states."""
    ranks = [
        stoker.Loader(
            spec,
            seq_len=SEQ,
            shuffle=True,
            seed=3,
            batch_size=batch,
            global_batch_size=24,
            rank=r,
            world_size=world,
            num_workers=1,
            resume_state=state,
        )
        for r in range(world)
    ]
    iters = [iter(()) for _ in ranks]
    out = []
    for _ in range(steps):
        union = []
        for r, loader in enumerate(ranks):
            mine = []
            while len(mine) < 24 // world:
                b = next(iters[r], None)
                if b is None:
                    iters[r] = iter(loader)
                    continue
                mine.extend(b["input_ids"].copy())
            union.extend(mine)
        out.append(np.array(union))
    states = {loader.state_dict()["state"] for loader in ranks}
    assert len(states) == 1, states
    for loader in ranks:
        loader.close()
    return out, states.pop()


def test_global_batches_and_resume_at_another_world_size(megatron):
    spec, _ = megatron
    want, _ = global_batches(spec, 1, 24, 6)
    got, state = global_batches(spec, 8, 3, 2)
    more, state = global_batches(spec, 6, 2, 3, state)
    rest, _ = global_batches(spec, 8, 1, 1, state)
    for b, (g, w) in enumerate(zip(got + more + rest, want)):
        np.testing.assert_array_equal(g, w, err_msg=f"global batch {b}")


def test_bad_index_names_the_file(tmp_path):
    write_megatron(tmp_path / "d", documents(3, 5))
    idx = (tmp_path / "d.idx").read_bytes()
    (tmp_path / "d.idx").write_bytes(b"XXIDIDX\x00\x00" + idx[9:])
    with pytest.raises(stoker.DecodeError) as e:
        stoker.Loader(f"megatron:{tmp_path / 'd'}", seq_len=SEQ)
    assert "d.idx" in str(e.value) and "magic" in str(e.value)


def test_blend_of_two_sources(tmp_path):
    a, b = documents(20, 1000), documents(20, 40_000)
    write_megatron(tmp_path / "a", a)
    write_megatron(tmp_path / "b", b)
    blend = f"0.75:megatron:{tmp_path / 'a'},0.25:megatron:{tmp_path / 'b'}"
    loader = stoker.Loader(None, blend=blend, seq_len=SEQ, batch_size=40, num_workers=0)
    ids = next(iter(loader))["input_ids"]
    from_b = np.cumsum(ids[:, 0] >= 40_000)
    k = np.arange(1, len(ids) + 1)
    assert (np.abs(from_b - 0.25 * k) <= 1).all()


def padded_reference(docs, seq=SEQ, pad=0):
    """token_packing=pad computed with NumPy: each document's first seq + 1 tokens, padded with
    `pad`; the mask 1 where the label is the document's own next token; the padding a segment
    of its own for position_ids and cu_seqlens."""
    window = np.full((len(docs), seq + 1), pad, dtype=np.int64)
    real = np.array([min(len(d), seq + 1) for d in docs])
    for i, d in enumerate(docs):
        window[i, : real[i]] = d[: real[i]]
    k = np.arange(seq)
    mask = (k[None, :] + 1 < real[:, None]).astype(np.uint8)
    inputs = np.minimum(real, seq)[:, None]
    positions = np.where(k[None, :] < inputs, k[None, :], k[None, :] - inputs)
    cu = [np.array([0, n, seq] if 0 < n < seq else [0, seq]) for n in inputs[:, 0]]
    return window[:, :-1], window[:, 1:], mask, positions, cu


def test_pad_packing_equals_numpy(tmp_path):
    lengths = [0, 1, 3, SEQ, SEQ + 1, SEQ + 2, 4 * SEQ, 2]
    docs = [2000 + 100 * d + np.arange(n) for d, n in enumerate(lengths)]
    docs += documents(10, 5000)
    write_megatron(tmp_path / "a", docs[:8])
    write_megatron(tmp_path / "b", docs[8:], dtype=np.int32)
    inputs, labels, mask, positions, cu = padded_reference(docs, pad=7)
    loader = stoker.Loader(
        f"megatron:{tmp_path / 'a'},{tmp_path / 'b'}",
        seq_len=SEQ,
        token_packing="pad",
        pad_token=7,
        document_boundaries="reset",
        batch_size=3,
        num_workers=2,
    )
    assert len(loader) == len(docs) // 3, "one sample a document"
    i = 0
    for batch in loader:
        assert batch["loss_mask"].dtype == np.uint8
        assert batch["loss_mask"].shape == (batch.size, SEQ)
        for k in range(batch.size):
            np.testing.assert_array_equal(batch["input_ids"][k], inputs[i])
            np.testing.assert_array_equal(batch["labels"][k], labels[i])
            np.testing.assert_array_equal(batch["loss_mask"][k], mask[i])
            np.testing.assert_array_equal(batch["position_ids"][k], positions[i])
            n = int(batch["cu_seqlens_lengths"][k])
            np.testing.assert_array_equal(batch["cu_seqlens"][k][:n], cu[i])
            i += 1
    assert i == len(docs) // 3 * 3
    # The mask counts each document's real labels: min(len, SEQ + 1) - 1, none below one token.
    np.testing.assert_array_equal(
        mask.sum(axis=1), [max(min(len(d), SEQ + 1) - 1, 0) for d in docs]
    )


def test_flat_file_with_a_sidecar_of_document_lengths(tmp_path):
    docs = [3000 + 100 * d + np.arange(n) for d, n in enumerate([0, 1, 3, SEQ, SEQ + 2, 4, 9])]
    np.concatenate(docs).astype(np.uint16).tofile(tmp_path / "train.bin")
    np.save(tmp_path / "train.lengths.npy", np.array([len(d) for d in docs]))
    spec = f"tokens:{tmp_path / 'train.bin'}"

    # One document a sample, as the sidecar lists them.
    inputs, labels, mask, _, _ = padded_reference(docs)
    loader = stoker.Loader(
        spec, token_dtype="uint16", seq_len=SEQ, token_packing="pad",
        batch_size=len(docs), num_workers=0,
    )
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["input_ids"], inputs)
    np.testing.assert_array_equal(batch["labels"], labels)
    np.testing.assert_array_equal(batch["loss_mask"], mask)

    # Windows whose positions restart at the sidecar's documents.
    inputs, labels, positions, cu = reference(docs)
    loader = stoker.Loader(
        spec, token_dtype="uint16", seq_len=SEQ, document_boundaries="reset",
        batch_size=len(inputs), num_workers=0,
    )
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["input_ids"], inputs)
    np.testing.assert_array_equal(batch["position_ids"], positions)
    for k, want in enumerate(cu):
        n = int(batch["cu_seqlens_lengths"][k])
        np.testing.assert_array_equal(batch["cu_seqlens"][k][:n], want)

    # Lengths that do not sum to the file's tokens: an error naming both files and numbers.
    total = sum(len(d) for d in docs)
    np.save(tmp_path / "train.lengths.npy", np.array([len(d) for d in docs[:-1]]))
    with pytest.raises(stoker.StokerError) as e:
        stoker.Loader(spec, token_dtype="uint16", seq_len=SEQ, batch_size=2)
    message = str(e.value)
    assert "train.lengths.npy" in message and "train.bin" in message
    assert f"sum to {total - 9} tokens" in message and f"holds {total} tokens" in message
