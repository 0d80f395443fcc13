"""Synthetic chunk datasets for `linstream sample`, the demo, tests and benchmarks."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

import numpy as np
from linstream.pipeline.elements import Chunk
from linstream.pipeline.io import write_chunk_file

__all__ = ["model_input", "run_sample", "sample_chunks", "sequence_chunks", "write_sample"]


def model_input(spec: str) -> tuple[int | None, int | None]:
    """(vocab_size, input_dim) of a model spec, so that samples are valid for it."""
    from linstream.ops import load_model

    cfg = load_model(spec).config
    return (cfg.vocab_size, None) if cfg.input_kind == "tokens" else (None, cfg.input_dim)


def sequence_chunks(
    seq_id: str,
    tokens: int,
    chunk_size: int,
    seed: int,
    *,
    vocab_size: int | None = 4096,
    input_dim: int | None = None,
) -> Iterator[Chunk]:
    """The chunks of one synthetic sequence, in order, generated lazily (one seed per chunk).

    Token ids in [0, vocab_size) when input_dim is None, else float32 features [T, input_dim].
    """
    if tokens < 1 or chunk_size < 1:
        msg = f"expected tokens >= 1 and chunk_size >= 1, got {tokens} and {chunk_size}"
        raise ValueError(msg)
    n_chunks = -(-tokens // chunk_size)
    for i in range(n_chunks):
        rng = np.random.default_rng([seed, i])
        t = min(chunk_size, tokens - i * chunk_size)
        data: np.ndarray
        if input_dim is None:
            data = rng.integers(0, vocab_size or 1, size=t, dtype=np.int32)
        else:
            data = rng.standard_normal((t, input_dim), dtype=np.float32)
        yield Chunk(seq_id, i, data, final=i == n_chunks - 1)


def sample_chunks(
    sequences: int,
    tokens: int,
    chunk_size: int,
    seed: int = 0,
    *,
    shuffle: bool = False,
    duplicates: int = 0,
    vocab_size: int | None = 4096,
    input_dim: int | None = None,
) -> list[Chunk]:
    """All chunks of `sequences` sequences (ids ``seq-0000``...), optionally shuffled, with
    `duplicates` chunks repeated."""
    chunks: list[Chunk] = []
    for s in range(sequences):
        chunks.extend(
            sequence_chunks(
                f"seq-{s:04d}",
                tokens,
                chunk_size,
                seed * 1_000_003 + s,
                vocab_size=vocab_size,
                input_dim=input_dim,
            )
        )
    rng = np.random.default_rng(seed)
    if duplicates:
        picks = rng.integers(0, len(chunks), size=duplicates)
        chunks.extend(chunks[int(i)] for i in picks)
    if shuffle:
        order = rng.permutation(len(chunks))
        chunks = [chunks[int(i)] for i in order]
    return chunks


def write_sample(
    output: str,
    sequences: int,
    tokens: int,
    chunk_size: int,
    seed: int = 0,
    *,
    shuffle: bool = False,
    duplicates: int = 0,
    vocab_size: int | None = 4096,
    input_dim: int | None = None,
    files: int = 1,
) -> list[str]:
    """Write a synthetic dataset as `files` Parquet files under `output`; returns their paths."""
    chunks = sample_chunks(
        sequences,
        tokens,
        chunk_size,
        seed,
        shuffle=shuffle,
        duplicates=duplicates,
        vocab_size=vocab_size,
        input_dim=input_dim,
    )
    paths = []
    for f in range(files):
        path = os.path.join(output, f"chunks-{f:05d}-of-{files:05d}.parquet")
        write_chunk_file(path, chunks[f::files], input_dim)
        paths.append(path)
    return paths


def run_sample(args: argparse.Namespace) -> int:
    """`linstream sample` with its parsed flags: write the chunk files, say what they hold."""
    vocab, dim = (args.vocab_size, args.input_dim)
    if vocab is None and dim is None:
        vocab, dim = model_input(args.model)
    paths = write_sample(
        args.output,
        args.sequences,
        args.tokens,
        args.chunk_tokens,
        args.seed,
        shuffle=args.shuffle,
        duplicates=args.duplicates,
        vocab_size=vocab,
        input_dim=dim,
        files=args.files,
    )
    n_chunks = args.sequences * -(-args.tokens // args.chunk_tokens) + args.duplicates
    print(
        f"wrote {n_chunks} chunks ({args.sequences} sequences x {args.tokens} tokens, "
        f"{args.chunk_tokens} tokens per chunk) to {', '.join(paths)}"
    )
    return 0
