"""Running the built llama.cpp (`helpers.llama_cpp`) on a checkpoint folder: conversion to GGUF,
`llama-bench`'s prompt processing parsed to tokens/s, and the final hidden states and last
logits from `llama-debug` for agreement checks against the torch models.

    gguf = convert_to_gguf(llama, folder, "bf16")            # folder-bf16.gguf beside it
    [r] = run_llama_bench(llama, gguf, prompts=(2048,), threads=2)
    r.tok_s                                                   # llama-bench's mean tokens/s
    out = llama_outputs(llama, gguf, "some text", workdir)   # out.tokens, out.hidden, out.logits

Conversion runs the sdist's own `convert_hf_to_gguf.py` with its `gguf-py` on PYTHONPATH under
this interpreter (its numpy, torch, safetensors and transformers).  Every failure is one line
(`LlamaCppError`) naming the command that failed, its exit status and where its output is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from helpers.llama_cpp import LlamaCpp, LlamaCppError

__all__ = [
    "OUTTYPES",
    "BenchResult",
    "LlamaOutputs",
    "convert_to_gguf",
    "llama_outputs",
    "parse_llama_bench_json",
    "run_llama_bench",
]

#: The precisions compared (convert_hf_to_gguf.py's --outtype names).
OUTTYPES = ("f32", "f16", "bf16")


def _run(what: str, cmd: list[str], log: Path, timeout_s: float, env=None) -> str:
    """cmd's stdout; its stderr goes to log.  One-line LlamaCppError on failure."""
    try:
        with open(log, "w") as err:
            out = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout_s, env=env
            )
    except subprocess.TimeoutExpired:
        raise LlamaCppError(f"{what} timed out after {timeout_s:.0f} s; see {log}") from None
    except OSError as e:
        raise LlamaCppError(f"{what} could not start ({e})") from None
    if out.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise LlamaCppError(
            f"{what} failed (exit {out.returncode}): {tail[0][:200]} (full output: {log})"
        )
    return out.stdout


def convert_to_gguf(
    llama: LlamaCpp,
    folder: str | os.PathLike[str],
    outtype: str,
    out: str | os.PathLike[str] | None = None,
    *,
    reuse: bool = True,
    timeout_s: float = 1800,
) -> Path:
    """folder (a Hugging Face checkpoint folder) converted to GGUF at outtype (f32, f16, bf16,
    or any other --outtype the converter takes) by llama.cpp's convert_hf_to_gguf.py; written to
    `out` (default: `<folder>-<outtype>.gguf` beside the folder) unless it exists and reuse."""
    folder = Path(folder)
    path = Path(out) if out is not None else folder.with_name(f"{folder.name}-{outtype}.gguf")
    if reuse and path.is_file():
        return path
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(llama.source / "gguf-py"), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("HF_HUB_OFFLINE", "1")
    tmp = path.with_name(f"{path.name}.part{os.getpid()}")  # concurrent conversions
    cmd = [
        sys.executable,
        str(llama.source / "convert_hf_to_gguf.py"),
        str(folder),
        "--outtype",
        outtype,
        "--outfile",
        str(tmp),
    ]
    log = path.with_name(path.name + ".log")
    _run(f"convert_hf_to_gguf.py {folder.name} --outtype {outtype}", cmd, log, timeout_s, env)
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class BenchResult:
    """One llama-bench test (a prompt size), as its JSON reports it."""

    n_prompt: int
    n_gen: int
    n_threads: int
    n_ubatch: int
    tok_s: float  # mean over the repetitions (avg_ts)
    tok_s_stddev: float
    samples_tok_s: tuple[float, ...]
    model_type: str  # e.g. "rwkv7 ?B all F32"
    n_params: int
    build_commit: str

    @property
    def best_tok_s(self) -> float:
        return max(self.samples_tok_s, default=self.tok_s)


def parse_llama_bench_json(text: str) -> list[BenchResult]:
    """The tests of `llama-bench -o json`'s stdout (a JSON array of objects, one per test)."""
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise LlamaCppError(
            f"llama-bench output: expected a JSON array, got {text[:80]!r}... ({e})"
        ) from None
    if not isinstance(rows, list):
        raise LlamaCppError(f"llama-bench output: expected a JSON array, got {type(rows).__name__}")
    out = []
    for i, r in enumerate(rows):
        try:
            out.append(
                BenchResult(
                    n_prompt=int(r["n_prompt"]),
                    n_gen=int(r["n_gen"]),
                    n_threads=int(r["n_threads"]),
                    n_ubatch=int(r["n_ubatch"]),
                    tok_s=float(r["avg_ts"]),
                    tok_s_stddev=float(r["stddev_ts"]),
                    samples_tok_s=tuple(float(x) for x in r.get("samples_ts", ())),
                    model_type=str(r["model_type"]),
                    n_params=int(r["model_n_params"]),
                    build_commit=str(r["build_commit"]),
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LlamaCppError(
                f"llama-bench output, test {i}: expected the keys n_prompt, "
                f"n_gen, n_threads, n_ubatch, avg_ts, stddev_ts, model_type, "
                f"model_n_params, build_commit; {type(e).__name__}: {e}"
            ) from None
    return out


def run_llama_bench(
    llama: LlamaCpp,
    gguf: str | os.PathLike[str],
    prompts: Sequence[int] = (2048,),
    threads: int = 2,
    *,
    repetitions: int = 5,
    extra_args: Sequence[str] = (),
    timeout_s: float = 1800,
) -> list[BenchResult]:
    """`llama-bench -m gguf -p <prompts> -n 0 -t threads -r repetitions -o json`: one result per
    prompt size (prompt processing only, llama-bench's own warm-up run first)."""
    gguf = Path(gguf)
    cmd = [
        str(llama.bench),
        "-m",
        str(gguf),
        "-p",
        ",".join(str(p) for p in prompts),
        "-n",
        "0",
        "-t",
        str(threads),
        "-r",
        str(repetitions),
        "-o",
        "json",
        *extra_args,
    ]
    log = gguf.with_name(gguf.name + ".bench.log")
    results = parse_llama_bench_json(_run(f"llama-bench {gguf.name}", cmd, log, timeout_s))
    if sorted(r.n_prompt for r in results) != sorted(prompts):
        raise LlamaCppError(
            f"llama-bench {gguf.name}: expected tests for prompts {list(prompts)}, "
            f"got {[r.n_prompt for r in results]}"
        )
    return results


@dataclass(frozen=True)
class LlamaOutputs:
    """What llama.cpp computed for a prompt: its token ids, the final hidden states (after the
    output norm, one row per token) and the last token's logits."""

    tokens: np.ndarray  # [T] int32
    hidden: np.ndarray  # [T, hidden] float32
    logits: np.ndarray  # [vocab] float32


def llama_outputs(
    llama: LlamaCpp,
    gguf: str | os.PathLike[str],
    prompt: str,
    workdir: str | os.PathLike[str],
    threads: int = 2,
    timeout_s: float = 600,
) -> LlamaOutputs:
    """llama-debug's saved outputs for prompt (text, tokenized by the GGUF's own tokenizer): one
    run with `--embedding --pooling none --embd-normalize -1` (every token's final hidden state)
    and one plain run (the last token's logits)."""
    gguf = Path(gguf)
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    base = [
        str(llama.debug),
        "-m",
        str(gguf),
        "-p",
        prompt,
        "-t",
        str(threads),
        "--save-logits",
        "--logits-output-dir",
        str(work),
    ]
    emb = ["--embedding", "--pooling", "none", "--embd-normalize", "-1"]
    _run(f"llama-debug {gguf.name} --embedding", [*base, *emb], work / "embedding.log", timeout_s)
    _run(f"llama-debug {gguf.name}", base, work / "logits.log", timeout_s)
    stem = work / f"llamacpp-{gguf.stem}"
    tokens = np.fromfile(f"{stem}-embeddings-tokens.bin", dtype=np.int32)
    hidden = np.fromfile(f"{stem}-embeddings.bin", dtype=np.float32)
    logits = np.fromfile(f"{stem}.bin", dtype=np.float32)
    if tokens.size == 0 or hidden.size % tokens.size:
        raise LlamaCppError(
            f"llama-debug {gguf.name}: {hidden.size} hidden values for "
            f"{tokens.size} tokens in {stem}-embeddings.bin"
        )
    return LlamaOutputs(tokens, hidden.reshape(tokens.size, -1), logits)
