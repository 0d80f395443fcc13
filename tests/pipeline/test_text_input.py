"""Text and token input: tokenizers, `ToChunks`, `read_input` over each input format."""

from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing import test_stream
from helpers.cli import write_texts
from helpers.models import write_tiny_model
from helpers.pipelines import _Dump, load_dumped
from hypothesis import given, settings
from hypothesis import strategies as st
from linstream.pipeline import Chunk, ToChunks
from linstream.pipeline.elements import ChunkCoder, DeadLetterCoder
from linstream.pipeline.errors import UsageError
from linstream.pipeline.io.text_input import (
    InputConfig,
    expand_input,
    plan_input,
    read_input,
)
from linstream.pipeline.io.tokenizers import (
    TextTokenizer,
    TokenizerError,
    byte_tokenizer,
    resolve_tokenizer,
)

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _collect(tmp_path, build, runner="FnApiRunner"):
    """Run `build(pipeline) -> (chunks, dead)`; returns (chunks sorted, dead letters)."""
    cdir, ddir = tmp_path / "c", tmp_path / "d"
    p = beam.Pipeline(options=PipelineOptions([f"--runner={runner}"]))
    chunks, dead = build(p)
    chunks | "DumpC" >> beam.ParDo(_Dump(str(cdir), ChunkCoder()))
    dead | "DumpD" >> beam.ParDo(_Dump(str(ddir), DeadLetterCoder()))
    p.run().wait_until_finish()
    got = sorted(load_dumped(str(cdir), ChunkCoder()), key=lambda c: (c.seq_id, c.index))
    return got, sorted(load_dumped(str(ddir), DeadLetterCoder()), key=lambda d: d.seq_id)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_builtin_bytes_is_utf8_and_equals_the_hugging_face_byte_tokenizer(text):
    fast = TextTokenizer().encode(text)
    hf = byte_tokenizer().encode(text, add_special_tokens=False).ids
    assert fast.dtype == np.int32
    assert fast.tolist() == list(text.encode("utf-8")) == hf


def test_tokenizer_json_round_trip_and_vocabulary_check(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(5000)} | {"[UNK]": 5000}
    big = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    big.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    big.save(str(path))
    tok = resolve_tokenizer(str(path))
    assert tok.encode("w1 w4999 zz").tolist() == [1, 4999, 5000]
    assert tok.vocab_size == 5001
    with pytest.raises(TokenizerError, match=r"ids 0\.\.5000, but model m reads ids 0\.\.4095"):
        tok.check_fits(4096, "m")
    tok.check_fits(5001, "m")
    with pytest.raises(TokenizerError, match="cannot read"):
        resolve_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"not a Hugging Face tokenizer\.json"):
        resolve_tokenizer(str(tmp_path / "bad.json"))


def test_a_model_file_names_its_tokenizer_relative_to_its_folder(tmp_path):
    from linstream.ops.model.weights import read_model_header

    byte_tokenizer().save(str(tmp_path / "tok.json"))
    model = tmp_path / "m.safetensors"
    write_tiny_model(str(model), tokenizer="tok.json")
    assert read_model_header(model.read_bytes())[1] == "tok.json"
    tok = resolve_tokenizer(None, str(model))
    assert tok.spec == str(tmp_path / "tok.json")
    assert tok.encode("hé").tolist() == [104, 195, 169]


def test_to_chunks_cuts_text_and_token_lists_deterministically(tmp_path):
    text = "linear attention " * 20  # 340 bytes
    elements = [("t", text), ("ids", list(range(10))), ("empty", ""), ("bad", [[1, 2], [3]])]
    got, dead = _collect(
        tmp_path,
        lambda p: p | beam.Create(elements) | ToChunks(chunk_tokens=64).with_exception_handling(),
    )
    t = [c for c in got if c.seq_id == "t"]
    assert [len(c.data) for c in t] == [64] * 5 + [20]
    assert [c.index for c in t] == list(range(6))
    assert [c.final for c in t] == [False] * 5 + [True]
    assert (
        np.concatenate([c.data for c in t]).tobytes()
        == np.frombuffer(text.encode(), np.uint8).astype(np.int32).tobytes()
    )
    ids = [c for c in got if c.seq_id == "ids"]
    assert ids == [Chunk("ids", 0, np.arange(10, dtype=np.int32), final=True)]
    assert [(d.seq_id, d.reason) for d in dead] == [
        ("bad", "untokenizable"),
        ("empty", "empty_sequence"),
    ]


def test_to_chunks_on_an_unbounded_stream(tmp_path):
    stream = (
        test_stream.TestStream()
        .add_elements([("a", "x" * 5)])
        .advance_watermark_to(10)
        .add_elements([("b", "yy")])
        .advance_watermark_to_infinity()
    )
    got, dead = _collect(
        tmp_path,
        lambda p: p | stream | ToChunks(chunk_tokens=2).with_exception_handling(),
        runner="BundleBasedDirectRunner",
    )
    assert [(c.seq_id, c.index, len(c.data), c.final) for c in got] == [
        ("a", 0, 2, False),
        ("a", 1, 2, False),
        ("a", 2, 1, True),
        ("b", 0, 2, True),
    ]
    assert dead == []


def test_read_input_text_folder_ids_are_relative_paths(tmp_path):
    root = write_texts(tmp_path / "docs", {"a.txt": "abcde", "sub/b.md": "é", "sub/.hidden": "x"})
    (root / "empty.txt").write_bytes(b"")
    args = InputConfig(input=str(root), chunk_tokens=2, model="builtin:default")
    got, dead = _collect(tmp_path, lambda p: read_input(p, args))
    assert [(c.seq_id, c.index, c.data.tolist(), c.final) for c in got] == [
        ("a.txt", 0, [97, 98], False),
        ("a.txt", 1, [99, 100], False),
        ("a.txt", 2, [101], True),
        ("sub/b.md", 0, [195, 169], True),
    ]
    assert [(d.seq_id, d.reason) for d in dead] == [("empty.txt", "empty_sequence")]
    assert plan_input(args).token_total() == 5 + 2


def test_read_input_jsonl_parquet_text_and_token_lists(tmp_path):
    jl = tmp_path / "rows.jsonl"
    jl.write_text(
        json.dumps({"doc": "r1", "body": "abc"})
        + "\n{broken\n"
        + json.dumps({"doc": "r2"})
        + "\n\n"
        + json.dumps({"doc": "r3", "body": 7})
        + "\n"
    )
    args = InputConfig(input=str(jl), id_column="doc", text_column="body", chunk_tokens=2)
    got, dead = _collect(tmp_path / "1", lambda p: read_input(p, args))
    assert [(c.seq_id, c.index, c.final) for c in got] == [("r1", 0, False), ("r1", 1, True)]
    assert [(d.seq_id, d.reason) for d in dead] == [
        (f"{jl}:2", "bad_input_row"),
        (f"{jl}:3", "bad_input_row"),
        ("r3", "bad_input_row"),
    ]
    assert dead[0].message.startswith(f"{jl}:2: not a JSON object")

    pqt = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"id": ["p1", "p2"], "text": ["xyz", None]}), pqt)
    got, dead = _collect(tmp_path / "2", lambda p: read_input(p, InputConfig(input=str(pqt))))
    assert [(c.seq_id, c.data.tolist()) for c in got] == [("p1", [120, 121, 122])]
    assert [(d.seq_id, d.reason) for d in dead] == [(f"{pqt}#2", "bad_input_row")]

    tj = tmp_path / "ids.jsonl"
    tj.write_text(json.dumps({"id": "t", "tokens": [1, 2, 3]}) + "\n")
    got, dead = _collect(tmp_path / "3", lambda p: read_input(p, InputConfig(input=str(tj))))
    assert [(c.seq_id, c.data.tolist(), c.final) for c in got] == [("t", [1, 2, 3], True)]


def test_an_unreadable_file_is_a_dead_letter_and_the_rest_goes_on(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": ["g"], "text": ["ok"]}), good)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    args = InputConfig(input=f"{good},{bad}", input_format="parquet-text")
    got, dead = _collect(tmp_path, lambda p: read_input(p, args))
    assert [c.seq_id for c in got] == ["g"]
    assert [d.reason for d in dead] == ["unreadable_file"]
    assert str(bad) in dead[0].message


def test_input_mistakes_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file or folder"):
        expand_input(str(tmp_path / "nope"))
    with pytest.raises(UsageError, match="no file matches"):
        expand_input(str(tmp_path / "*.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="the folder has no files"):
        expand_input(str(tmp_path / "empty"))
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"a": [1]}), other)
    with pytest.raises(UsageError, match=r"columns \['a'\]"):
        read_input(beam.Pipeline(), InputConfig(input=str(other)))
    with pytest.raises(UsageError, match="vocabulary"):
        from tokenizers import Tokenizer, models

        big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(5000)}, unk_token="w0"))
        big.save(str(tmp_path / "big.json"))
        txt = write_texts(tmp_path / "t", {"a.txt": "x"})
        spec = InputConfig(input=str(txt), tokenizer=str(tmp_path / "big.json"))
        read_input(beam.Pipeline(), spec)
