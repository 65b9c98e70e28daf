"""``parquet:`` token sources: Parquet files that pyarrow writes, a text column tokenized by a
``tokenizer.json`` that Hugging Face's ``tokenizers`` trains and saves, checked token for token
against that library's own ``encode`` laid end to end with NumPy; the counts cached; bad input
named at open; ``stoker pack`` writes the same stream as a ``tokens:`` file.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tokenizers

import stoker
from test_tokens import reference

SEQ = 16
EOS = 1  # "</s>" in the trained vocabulary

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "",
    "Ünïcödé, emoji 🚀 and CJK 日本語 are bytes to a byte-level BPE.",
    None,  # a null: an empty document
    "def add(a, b):\n    return a + b\n",
    " ".join(f"word{i}" for i in range(120)),  # longer than several windows
] + [f"document {d}: " + "lorem ipsum dolor sit amet " * (d % 7) for d in range(40)]


def write_tokenizer(path):
    """A byte-level BPE trained on TEXTS, with a BOS added to every document as Llama's and
    GPT-NeoX's are, saved as `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([t for t in TEXTS if t] * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    assert tok.token_to_id("</s>") == EOS
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json")


def encode(tokenizer_path, text, eos=None):
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    ids = tok.encode(text or "").ids
    return np.array(ids + ([eos] if eos is not None else []), dtype=np.int64)


@pytest.fixture
def shards(tmp_path):
    """Two files: snappy with row groups of 7 rows, and zstd in one row group."""
    half = 25
    pq.write_table(
        pa.table({"id": list(range(half)), "text": TEXTS[:half]}),
        tmp_path / "web-0.parquet",
        row_group_size=7,
        compression="snappy",
    )
    pq.write_table(
        pa.table({"text": pa.array(TEXTS[half:], type=pa.large_string())}),
        tmp_path / "web-1.parquet",
        compression="zstd",
    )
    return f"parquet:{tmp_path}/web-*.parquet"


def every_sample(loader):
    out = {}
    for batch in loader:
        for name in ("input_ids", "labels", "position_ids", "loss_mask"):
            if name in batch:
                out.setdefault(name, []).extend(np.array(batch[name]))
    return {k: np.array(v) for k, v in out.items()}


def test_windows_equal_the_tokenizers_library_laid_end_to_end(shards, tokenizer_path):
    docs = [encode(tokenizer_path, t, EOS) for t in TEXTS]
    inputs, labels, positions, _ = reference(docs, SEQ)
    for workers in (0, 3):
        loader = stoker.Loader(
            shards,
            tokenizer=str(tokenizer_path),
            eos_token=EOS,
            seq_len=SEQ,
            document_boundaries="reset",
            batch_size=4,
            num_workers=workers,
        )
        assert len(loader) == len(inputs) // 4
        got = every_sample(loader)
        n = len(got["input_ids"])
        assert n == len(inputs) // 4 * 4
        np.testing.assert_array_equal(got["input_ids"], inputs[:n])
        np.testing.assert_array_equal(got["labels"], labels[:n])
        np.testing.assert_array_equal(got["position_ids"], positions[:n])


def test_the_counts_are_cached_beside_the_files_and_a_new_tokenizer_recounts(
    shards, tokenizer_path, tmp_path
):
    options = dict(tokenizer=str(tokenizer_path), seq_len=SEQ, batch_size=2)
    first = len(stoker.Loader(shards, **options))
    cached = sorted(p.name for p in tmp_path.glob(".web-*.parquet.stkidx"))
    assert cached == [".web-0.parquet.stkidx", ".web-1.parquet.stkidx"]
    stamps = [p.stat().st_mtime_ns for p in sorted(tmp_path.glob(".*.stkidx"))]
    assert len(stoker.Loader(shards, **options)) == first
    assert [p.stat().st_mtime_ns for p in sorted(tmp_path.glob(".*.stkidx"))] == stamps, (
        "a second open maps the cached counts instead of tokenizing again"
    )
    # An EOS after every document is another stream: counted again, not read from the cache.
    docs = [encode(tokenizer_path, t, EOS) for t in TEXTS]
    assert len(stoker.Loader(shards, eos_token=EOS, **options)) == (
        (sum(map(len, docs)) - 1) // SEQ // 2
    )


def test_pad_packing_is_one_row_a_sample(shards, tokenizer_path):
    loader = stoker.Loader(
        shards,
        tokenizer=str(tokenizer_path),
        seq_len=SEQ,
        token_packing="pad",
        pad_token=0,
        batch_size=len(TEXTS),
        num_workers=2,
    )
    batch = next(iter(loader))
    for i, text in enumerate(TEXTS):
        doc = encode(tokenizer_path, text)[: SEQ + 1]
        row = np.zeros(SEQ + 1, dtype=np.int64)
        row[: len(doc)] = doc
        np.testing.assert_array_equal(batch["input_ids"][i], row[:-1])
        np.testing.assert_array_equal(batch["labels"][i], row[1:])
        assert batch["loss_mask"][i].sum() == max(len(doc) - 1, 0)


def stoker_command():
    installed = Path(sys.executable).parent / "stoker"
    if installed.exists():
        return installed
    built = Path(__file__).resolve().parents[3] / "target" / "release" / "stoker"
    assert built.exists(), "neither an installed nor a built stoker command"
    return built


def test_stoker_pack_writes_the_same_stream_as_a_tokens_file(shards, tokenizer_path, tmp_path):
    out = tmp_path / "packed" / "web.npy"
    out.parent.mkdir()
    run = subprocess.run(
        [stoker_command(), "pack", shards, str(out), "--set", f"tokenizer={tokenizer_path}",
         "--set", f"eos_token={EOS}"],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    docs = [encode(tokenizer_path, t, EOS) for t in TEXTS]
    tokens = np.load(out)
    assert tokens.dtype == np.uint16, "a 400-token vocabulary fits uint16"
    np.testing.assert_array_equal(tokens, np.concatenate(docs))
    np.testing.assert_array_equal(np.load(tmp_path / "packed" / "web.lengths.npy"), [len(d) for d in docs])
    options = dict(seq_len=SEQ, document_boundaries="reset", batch_size=4)
    from_parquet = every_sample(
        stoker.Loader(shards, tokenizer=str(tokenizer_path), eos_token=EOS, **options)
    )
    from_tokens = every_sample(stoker.Loader(f"tokens:{out}", **options))
    for name in from_parquet:
        np.testing.assert_array_equal(from_parquet[name], from_tokens[name])


def test_bad_input_is_named_at_open(shards, tokenizer_path, tmp_path):
    def refused(spec=shards, **options):
        tokenizer = options.pop("tokenizer", str(tokenizer_path))
        if tokenizer is not None:
            options["tokenizer"] = tokenizer
        with pytest.raises(stoker.StokerError) as e:
            stoker.Loader(spec, seq_len=SEQ, batch_size=2, **options)
        return str(e.value)

    message = refused(text_column="body")
    assert "web-0.parquet" in message and "no column `body`" in message
    assert "id, text" in message, "the columns it has"
    message = refused(text_column="id")
    assert "column `id` holds INT64" in message and "not text" in message
    message = refused(tokenizer=None)
    assert "tokenizer" in message and "required" in message
    (tmp_path / "bad.json").write_text('{"not": "a tokenizer"}')
    message = refused(tokenizer=str(tmp_path / "bad.json"))
    assert "bad.json" in message and "tokenizer.json" in message
    assert "vocab_size" in refused(vocab_size=100)
    assert "eos_token" in refused(eos_token=10**6)
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    message = refused(f"parquet:{tmp_path / 'broken.parquet'}")
    assert "broken.parquet" in message and "not a Parquet file" in message
    # tokenizer= on another source names the option.
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "flat.bin")
    message = refused(f"tokens:{tmp_path / 'flat.bin'}", token_dtype="uint16")
    assert "tokenizer" in message and "parquet:" in message
