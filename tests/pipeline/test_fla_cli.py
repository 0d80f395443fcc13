"""`linstream embed --model <checkpoint folder in fla's format>`, as a user runs it.

The written embeddings equal fla's own hidden states (`--layer N` its `hidden_states[N]`, the
default the final norm) on a model built and saved by fla itself, run on the CPU on its naive
references (tests/helpers/fla_oracle.py), and transformers' own for Mamba-2
(tests/helpers/mamba2_oracle.py).  Tolerance, derived from the dtype as in
tests/ops/fla/test_fla_oracle.py: the job computes in float32, so it must stay within 8 · e32 of
fla in float64, e32 being fla's own float32 error on the same tokens (8: another summation
order).  A job stopped by SIGKILL (or SIGINT) and resumed writes the same results, bit for bit,
as one uninterrupted job (tests/helpers/crash.py judges the union of every job's files).
Refusals are one line and exit 2.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from helpers.crash import crash_and_resume, embed_cmd, reference_files, result_rows
from helpers.fla_folders import TINY_CONFIGS, random_weights, write_folder
from linstream.pipeline import Chunk
from linstream.pipeline.app.sample import sample_chunks
from linstream.pipeline.io import write_chunk_file

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

SEED = 20261203


def _token_chunks(path, ids, sizes):
    """One sequence "s" of token ids cut into chunks of ``sizes``, written as Parquet."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    chunks = [
        Chunk("s", i, ids[a:b].astype(np.int32), final=i == len(sizes) - 1)
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    write_chunk_file(str(path), chunks)
    return str(path)


def _token_rows(out):
    """{start position: [T, d] embeddings} of the per-token results under ``out``."""
    rows = {}
    for f in sorted((out / "results").rglob("*.parquet")):
        t = pq.read_table(f).to_pydict()
        for start, emb in zip(t["start_position"], t["embeddings"], strict=True):
            rows[int(start)] = np.asarray(emb, np.float64)
    return rows


def _oracle(name, tmp_path):
    """(a folder built by the model's own library, its runner (ids, torch dtype) -> hidden
    states in linstream's numbering): fla's classes, transformers' Mamba2ForCausalLM."""
    if name == "mamba2":
        from helpers.mamba2_oracle import run_mamba2
        from helpers.rwkv_mamba_models import write_model_folder

        return write_model_folder(tmp_path / name, "mamba2", "tiny"), run_mamba2
    pytest.importorskip("fla", reason="flash-linear-attention is a test extra")
    from helpers.fla_oracle import build_and_save, run_fla, tiny_configs
    from helpers.fla_oracle_rwkv7 import patch_rwkv7_for_cpu
    from helpers.rwkv_mamba_models import write_model_folder

    if name == "rwkv7":  # fla's RWKV7ForCausalLM (helpers.rwkv_mamba_models' tiny model)
        patch_rwkv7_for_cpu()
        return write_model_folder(tmp_path / name, name, "tiny"), run_fla
    return build_and_save(name, tiny_configs()[name], tmp_path), run_fla


@pytest.mark.parametrize(
    ("name", "layer"), [("retnet", 1), ("gla", None), ("mamba2", None), ("rwkv7", None)]
)
def test_embeddings_equal_fla_hidden_states(tmp_path, name, layer):
    """The job's embeddings are the hidden states of the model's own library (fla's classes;
    transformers' for Mamba-2) on the same tokens."""
    torch = pytest.importorskip("torch")
    folder, run = _oracle(name, tmp_path)
    rng = np.random.default_rng(SEED)
    print(f"seed={SEED}")
    sizes = rng.integers(1, 40, 5)
    ids = rng.integers(0, 128, int(sizes.sum()))
    inp = _token_chunks(tmp_path / "in.parquet", ids, sizes)
    out = tmp_path / "out"
    args = ["embed", "--model", folder, "--input", inp, "--output", out, "--emit", "tokens"]
    args += ["--progress-every", "0", *(["--layer", str(layer)] if layer is not None else [])]
    done = linstream(*args)
    assert done.returncode == 0, done.stderr
    ref = run(folder, ids, torch.float64)
    e32 = max(
        float(np.max(np.abs(a - b)))
        for a, b in zip(run(folder, ids, torch.float32), ref, strict=True)
    )
    want = ref[len(ref) - 1 if layer is None else layer]
    rows = _token_rows(out)
    assert sorted(rows) == [int(s) for s in np.concatenate([[0], np.cumsum(sizes)[:-1]])]
    got = np.concatenate([rows[s] for s in sorted(rows)])
    err = float(np.max(np.abs(got - want)))
    print(f"{name} layer {layer}: error {err:.3g}, tolerance {8 * e32:.3g}")
    assert err <= 8 * e32
    if layer is not None:  # another hidden state would not pass
        assert float(np.max(np.abs(got - ref[-1]))) > 8 * e32


@pytest.mark.parametrize("name", ["gla", "mamba2", "rwkv7"])
def test_a_killed_and_resumed_job_writes_what_one_job_writes(tmp_path, name):
    """SIGKILL / SIGINT at random moments, then a resume over the full input: every chunk once,
    bit-identical to an uninterrupted job (GLA with short convolutions, Mamba-2 with its SSM
    state and the convolution's tail over x, B, C, RWKV-7 with its two token shifts' last
    inputs: all in every checkpoint; RWKV-7's layer-0 v reaches the later layers within each
    chunk)."""
    seed = SEED + 1
    print(f"crash harness seed {seed}, model {name}")
    folder = str(write_folder(tmp_path / name, TINY_CONFIGS[name], seed=3))
    chunks = sample_chunks(3, 40 * 16, 16, seed=seed, shuffle=True, duplicates=4, vocab_size=50)
    inp = str(tmp_path / "in.parquet")
    write_chunk_file(inp, chunks)
    extra = ("--checkpoint-every", "4")
    ref = str(tmp_path / "reference")
    files = reference_files(embed_cmd(folder, inp, ref, str(tmp_path / "ckpt-ref"), *extra), ref)
    assert len(result_rows(ref)) == len({(c.seq_id, c.index) for c in chunks})
    verdict, stops = crash_and_resume(
        seed, folder, inp, str(tmp_path), ref, kills=2, files=files, extra=extra
    )
    print(f"stops {[(s.signal, s.after_files, s.returncode) for s in stops]}: {verdict}")
    assert any(s.returncode != 0 for s in stops), "no stop landed while a job ran"
    assert verdict.ok, str(verdict)
    manifests = list((tmp_path / "ckpt").rglob("*.commit.json"))
    assert manifests and all(json.loads(m.read_text())["format_version"] == 3 for m in manifests)


@pytest.fixture(scope="module")
def gla_folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("fla") / "gla", TINY_CONFIGS["gla"])


def test_refusals_are_one_line_and_exit_2(tmp_path, gla_folder):
    texts = write_texts(tmp_path / "texts", {"a.txt": "hello"})
    base = ["embed", "--input", texts, "--output", tmp_path / "out", "--progress-every", "0"]

    def refused(*args):
        done = linstream(*base, *args)
        line = one_error_line(done)
        print(line)
        assert done.returncode == 2, done.stderr
        return line

    line = refused("--model", gla_folder, "--layer", "3", "--tokenizer", "builtin:bytes")
    assert "layer must be an integer from 0 (the embeddings) to 2" in line and "got 3" in line
    line = refused("--model", "builtin:default", "--layer", "1")
    assert "needs a checkpoint folder in fla's format" in line
    assert "no tokenizer.json in the folder" in refused("--model", gla_folder)
    (gla_folder / "tokenizer.model").write_bytes(b"\x00sentencepiece")
    line = refused("--model", gla_folder)
    assert "--tokenizer not given" in line and "only a SentencePiece tokenizer.model" in line
    assert "download the model's tokenizer.json" in line
    cfg = {**TINY_CONFIGS["gla"], "attn": {"layers": [1], "num_heads": 2}}
    hybrid = write_folder(tmp_path / "hybrid", cfg, weights=random_weights(TINY_CONFIGS["gla"]))
    line = refused("--model", hybrid, "--tokenizer", "builtin:bytes")
    assert 'config option attn = {"layers": [1], "num_heads": 2} is not supported' in line


@pytest.mark.parametrize("name", ["hgrn2", "mamba2"])
def test_text_is_tokenized_with_the_folders_tokenizer_json(tmp_path, name):
    """No --tokenizer: the folder's tokenizer.json (here a byte-level one: ids are the UTF-8
    bytes) tokenizes the text; each file's chunk mean is the model's on those ids."""
    from linstream.ops import load_model
    from linstream.pipeline.io.tokenizers import byte_tokenizer

    folder = write_folder(tmp_path / "m", {**TINY_CONFIGS[name], "vocab_size": 256})
    byte_tokenizer().save(str(folder / "tokenizer.json"))
    texts = {"a.txt": "héllo, linear attention", "b/c.txt": "streams of text"}
    inp = write_texts(tmp_path / "texts", texts)
    out = tmp_path / "out"
    done = linstream("embed", "--model", folder, "--input", inp, "--output", out,
                     "--progress-every", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    model = load_model(str(folder))
    rows = {}
    for f in (out / "results").rglob("*.parquet"):
        t = pq.read_table(f).to_pydict()
        rows.update(zip(t["seq_id"], t["embedding"], strict=True))
    assert sorted(rows) == sorted(texts)
    for name, text in texts.items():
        ids = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)
        emb, _ = model.embed_chunk(ids, None)
        want = np.asarray(emb.sum(axis=0, dtype=np.float64) / len(ids), np.float32)
        assert np.array_equal(np.asarray(rows[name], np.float32), want), name


def _gpt_neox_style_tokenizer(path):
    """A tokenizer.json built as GPT-NeoX's is (the tokenizer of the Mamba-2 checkpoints): NFC
    normalizer, byte-level BPE over the GPT-2 regex split without a prefix space, byte-level
    post-processor and decoder, <|endoftext|> and <|padding|> as added special tokens; its
    merges trained here on a few sentences (seeded: the trainer is deterministic)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "streams of text through a state space model",
        "the café's menu: 日本語 and more",
        "Mamba-2 carries its state   between chunks",
        "tabs\tand newlines\n\n",
    ] * 20
    trainer = BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.save(str(path))


def test_a_gpt_neox_tokenizer_json_tokenizes_as_transformers_does(tmp_path):
    """A Mamba-2 folder with a GPT-NeoX style tokenizer.json and no --tokenizer: each file is
    tokenized as transformers' GPTNeoXTokenizer reads that file tokenizes it (merges, the NFC
    normalizer on a decomposed é, the special token in the text as its one id, runs of
    spaces), and the chunk mean written is the model's on those ids."""
    from linstream.ops import load_model
    from transformers import GPTNeoXTokenizer

    folder = write_folder(tmp_path / "m", {**TINY_CONFIGS["mamba2"], "vocab_size": 512})
    _gpt_neox_style_tokenizer(folder / "tokenizer.json")
    oracle = GPTNeoXTokenizer(tokenizer_file=str(folder / "tokenizer.json"))
    texts = {
        "a.txt": "streams of text through a state space model<|endoftext|>Mamba-2 carries",
        "b.txt": "the cafe\u0301's menu:   日本語\tand newlines\n\nbetween chunks",
    }
    inp = write_texts(tmp_path / "texts", texts)
    out = tmp_path / "out"
    done = linstream("embed", "--model", folder, "--input", inp, "--output", out,
                     "--progress-every", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    model = load_model(str(folder))
    rows = {}
    for f in (out / "results").rglob("*.parquet"):
        t = pq.read_table(f).to_pydict()
        rows.update(zip(t["seq_id"], t["embedding"], strict=True))
    assert sorted(rows) == sorted(texts)
    for name, text in texts.items():
        ids = np.asarray(oracle(text)["input_ids"], np.int32)
        print(name, ids.tolist())
        assert 0 in ids.tolist() or name != "a.txt"  # <|endoftext|> is id 0, one token
        assert len(ids) < len(text.encode("utf-8")) // 2  # merged, not bytes
        emb, _ = model.embed_chunk(ids, None)
        want = np.asarray(emb.sum(axis=0, dtype=np.float64) / len(ids), np.float32)
        assert np.array_equal(np.asarray(rows[name], np.float32), want), name


def test_a_folder_with_only_rwkvs_world_vocabulary_says_how_to_tokenize(tmp_path):
    """An RWKV-7 folder with rwkv_vocab_v20230424.txt and no tokenizer.json: text input is one
    line saying how to tokenize with the world tokenizer and pass the ids (exit 2); those ids,
    as tokens-jsonl, embed."""
    folder = write_folder(tmp_path / "rwkv7", TINY_CONFIGS["rwkv7"])
    (folder / "rwkv_vocab_v20230424.txt").write_text("".join(
        f"{i} {bytes([i])!r} 1\n" for i in range(256)
    ))  # fmt: skip
    texts = write_texts(tmp_path / "texts", {"a.txt": "hello"})
    base = ["embed", "--model", folder, "--progress-every", "0"]
    done = linstream(*base, "--input", texts, "--output", tmp_path / "out")
    line = one_error_line(done)
    print(line)
    assert done.returncode == 2, done.stderr
    assert "only RWKV's world vocabulary rwkv_vocab_v20230424.txt" in line
    assert "TRIE_TOKENIZER" in line and "--input-format tokens-jsonl" in line
    ids = tmp_path / "ids.jsonl"
    ids.write_text(json.dumps({"id": "a", "tokens": [4, 1, 8, 8, 11]}) + "\n")
    out = tmp_path / "ids_out"
    done = linstream(*base, "--input", ids, "--input-format", "tokens-jsonl", "--output", out)
    assert done.returncode == 0, done.stderr
    assert list((out / "results").rglob("*.parquet"))
