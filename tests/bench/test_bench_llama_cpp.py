"""Benchmark: prompt processing on RWKV-7 (~190M) and Mamba-2 (~130M) with random weights, the
same folder for every contender: llama.cpp (`llama-bench`, f32 / f16 / bf16 GGUFs converted
from the folder), fla's RWKV-7 and transformers' Mamba-2 on the CPU (torch, float32), and
linstream's runtime on the same folder (float32, for the families it loads).

    .venv/bin/python -m pytest tests/bench/test_bench_llama_cpp.py -m bench -s -p no:randomly

llama.cpp is built on first use from `llama-cpp-python`'s pinned sdist into
~/.cache/linstream/llama.cpp (`helpers.llama_cpp`: minutes on 2 cores, then reused).  The
folders are built with the models' own classes (`helpers.rwkv_mamba_models`) and kept, with
their GGUFs, in that cache's `<version>/models/` for the next run.  Each contender
runs in a fresh process (`python this_file <contender> <family> <folder>`) and returns its
columns of tokens/s; llama-bench runs its own warm-up and reports the mean of its repetitions;
the torch contenders time whole-sequence forwards of the base model (final hidden states, no
output head: llama-bench's prompt processing computes the last token's logits only) after a
warm-up call (the first call in a process has run up to ten times slower), best of ROUNDS.

A contender is one function `(family, folder) -> {column: tokens/s}` registered in CONTENDERS
(runs in its own process, 2 threads, on PROMPT tokens from `prompt_ids`); the table gets its
columns in the order registered.

On a busy machine the torch contenders' figures mean little: fla's RWKV-7 recurrence is a
Python loop of small tensor operations, and with 2 torch threads each one waits for the second
thread, descheduled by the neighbours (256 tokens took 36 s on 2 threads and 4.6 s on 1 at a
load average of 7; llama.cpp's spinning threads suffer less).  Read the load averages printed.

Environment: LINSTREAM_LLAMA_PROMPT (tokens, default 2048), LINSTREAM_LLAMA_SIZE ("bench", or
"tiny" for a smoke run), LINSTREAM_LLAMA_REPS (llama-bench's repetitions, default 5),
LINSTREAM_LLAMA_CACHE and LINSTREAM_LLAMA_BUILD_TIMEOUT (`helpers.llama_cpp`).  This CPU's
flags decide llama.cpp's bf16 path: without AVX512-BF16 its bf16 products are emulated; the
table's header says which.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers.gemm_roof import cpu_flags
from helpers.llama_cpp_run import BenchResult, parse_llama_bench_json

PROMPT = int(os.environ.get("LINSTREAM_LLAMA_PROMPT", "2048"))
SIZE = os.environ.get("LINSTREAM_LLAMA_SIZE", "bench")
THREADS = 2
ROUNDS = 2
REPETITIONS = int(os.environ.get("LINSTREAM_LLAMA_REPS", "5"))  # llama-bench's -r
SEED = 7
FAMILIES = ("rwkv7", "mamba2")
AGREE_TOKENS = 128  # the agreement check's prompt (RWKV: one token per byte)


def prompt_ids(family: str, n: int = PROMPT) -> np.ndarray:
    """The n token ids every contender runs (seeded; ids every tokenizer and size accept)."""
    return np.random.default_rng(SEED).integers(1, 257 if family == "rwkv7" else 50000, n)


def _threads() -> None:
    import torch

    torch.set_num_threads(THREADS)


# -- contenders (each runs in its own process) ---------------------------------------------------
def run_llama_cpp(family: str, folder: str) -> dict[str, float]:
    """llama-bench's mean prompt-processing tokens/s at f32, f16 and bf16."""
    from helpers.llama_cpp import ensure_llama_cpp
    from helpers.llama_cpp_run import OUTTYPES, convert_to_gguf, run_llama_bench

    llama = ensure_llama_cpp()
    out = {}
    for t in OUTTYPES:
        gguf = convert_to_gguf(llama, folder, t)
        [r] = run_llama_bench(llama, gguf, (PROMPT,), THREADS, repetitions=REPETITIONS)
        out[f"llama.cpp {t}"] = r.tok_s
    return out


def run_torch(family: str, folder: str) -> dict[str, float]:
    """fla's RWKV-7 (naive references) / transformers' Mamba-2 (torch path), float32."""
    import torch
    from helpers.rwkv_mamba_models import load_model

    _threads()
    model = load_model(folder, family).base_model
    x = torch.as_tensor(prompt_ids(family), dtype=torch.long)[None]
    times = []
    with torch.no_grad():
        for _ in range(1 + ROUNDS):  # the first call is the warm-up
            t0 = time.perf_counter()
            model(x, use_cache=False)
            times.append(time.perf_counter() - t0)
    return {
        "fla / transformers f32": PROMPT / min(times[1:]),
        "fla / transformers f32, first call": PROMPT / times[0],
    }


def run_linstream(family: str, folder: str) -> dict[str, float]:
    """linstream's runtime on the folder (float32 compute, float64 state), the whole prompt as
    one chunk from a fresh state, after a warm-up chunk (Numba's compilation); best of ROUNDS.
    BLAS and Numba at THREADS threads (the runtime holds BLAS at one thread per product and
    splits a chunk's rows over as many threads as BLAS had).  A family the runtime does not
    load yet gets no column."""
    import numba
    import scipy.linalg.cython_blas  # noqa: F401  (Numba's BLAS, so that the limit reaches it)
    from linstream.ops.model.fla import load_model
    from linstream.ops.model.fla.config import FAMILIES as LOADED
    from threadpoolctl import threadpool_limits

    if family not in LOADED:
        return {}
    threadpool_limits(THREADS)
    numba.set_num_threads(min(THREADS, numba.config.NUMBA_NUM_THREADS))
    model = load_model(folder)
    ids = prompt_ids(family)
    model.embed_chunk(ids, None)  # the warm-up
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        model.embed_chunk(ids, None)
        times.append(time.perf_counter() - t0)
    return {"linstream f32": PROMPT / min(times)}


CONTENDERS: dict[str, Callable[[str, str], dict[str, float]]] = {
    "llama_cpp": run_llama_cpp,
    "torch": run_torch,
    "linstream": run_linstream,
}


# -- the benchmark --------------------------------------------------------------------------------
def _run(contender: str, family: str, folder: Path) -> dict[str, float]:
    tests = str(Path(__file__).resolve().parents[1])  # `helpers` in the child, as pytest has it
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH", "")) if p),
    }
    r = subprocess.run(
        [sys.executable, __file__, contender, family, str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
        env=env,
    )
    assert r.returncode == 0, (
        f"{contender} on {family} failed:\n{r.stdout[-2000:]}{r.stderr[-4000:]}"
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


@pytest.fixture(scope="module")
def llama():
    from helpers.llama_cpp import ensure_llama_cpp

    t0 = time.perf_counter()
    built = ensure_llama_cpp()
    print(
        f"\nllama.cpp {built.commit[:9]} ready in {time.perf_counter() - t0:.0f} s "
        f"(built in {built.info['build_s']:.0f} s): {built.root}"
    )
    return built


@pytest.fixture(scope="module")
def folders(llama):
    """The two random folders, and their GGUFs at every precision: kept beside the build
    (about 4 GB at the bench size) and reused by the next run."""
    from helpers.llama_cpp_run import OUTTYPES, convert_to_gguf
    from helpers.rwkv_mamba_models import cached_model_folder, parameter_counts

    out = {}
    for family in FAMILIES:
        t0 = time.perf_counter()
        folder = cached_model_folder(llama.root / "models", family, SIZE, seed=SEED)
        for t in OUTTYPES:
            convert_to_gguf(llama, folder, t)
        total, body = parameter_counts(folder)
        print(
            f"{family}: {total / 1e6:.1f}M parameters ({body / 1e6:.1f}M without embeddings), "
            f"folder and GGUFs ready in {time.perf_counter() - t0:.0f} s: {folder}"
        )
        out[family] = folder
    return out


@pytest.mark.bench
def test_llama_cpp_agrees_with_the_torch_models(folders, llama, tmp_path):
    """llama.cpp's f32 GGUF and the torch model on the same folder and tokens: final hidden
    states and last logits agree to float32 rounding.

    Tolerance, per token, ‖h_llama − h_torch‖ / ‖h_torch‖: both run float32 with different
    summation orders (and Mamba-2's scan chunked in torch, token by token in llama.cpp); a
    float32 dot product of length K is off by about √K·u relative (u = 2⁻²⁴), and L blocks add
    their errors on the residual stream, so the bound is 8·L·√K_max·u (8: headroom for the
    norms' and the recurrences' own rounding): 3.2e-4 for RWKV-7 (L 12, K 3072), 4.5e-4 for
    Mamba-2 (L 24, K 1536).  A wrong tensor, eps or decay shows at 1e-2 and above."""
    from helpers.llama_cpp_run import convert_to_gguf, llama_outputs
    from helpers.rwkv_mamba_models import load_model, run_model

    u = 2.0**-24
    text = "".join(chr(c) for c in np.random.default_rng(SEED).integers(97, 123, AGREE_TOKENS))
    for family, folder in folders.items():
        out = llama_outputs(
            llama, convert_to_gguf(llama, folder, "f32"), text, tmp_path / family, THREADS
        )
        cfg = json.loads((folder / "config.json").read_text())
        layers = cfg["num_hidden_layers"]
        k_max = max(cfg.get("intermediate_size") or 0, cfg["hidden_size"] * cfg.get("expand", 1))
        tol = 8 * layers * k_max**0.5 * u
        hidden, logits = run_model(load_model(folder, family), out.tokens)
        rel_h = np.linalg.norm(out.hidden - hidden, axis=1) / np.linalg.norm(hidden, axis=1)
        rel_l = np.linalg.norm(out.logits - logits[-1]) / np.linalg.norm(logits[-1])
        print(
            f"{family}: {len(out.tokens)} tokens, hidden max |Δ| "
            f"{np.abs(out.hidden - hidden).max():.2e} (per-token relative ≤ {rel_h.max():.2e}), "
            f"last logits max |Δ| {np.abs(out.logits - logits[-1]).max():.2e} "
            f"(relative {rel_l:.2e}); bound {tol:.1e}"
        )
        assert out.hidden.shape == hidden.shape, (family, out.hidden.shape, hidden.shape)
        assert rel_h.max() <= tol and rel_l <= tol, (family, rel_h.max(), rel_l, tol)


@pytest.mark.bench
def test_bench_prompt_processing(folders, llama):
    flags = set(cpu_flags())
    bf16 = "native (AVX512-BF16)" if "avx512_bf16" in flags else "emulated (no AVX512-BF16)"
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    lines = [
        f"{PROMPT}-token prompts, {THREADS} threads, random weights ({SIZE}); llama.cpp "
        f"{llama.commit[:9]}; CPU {simd}, llama.cpp's bf16 {bf16}; "
        f"load average at the start {_load()}"
    ]
    rows: dict[str, dict[str, float]] = {}
    for family, folder in folders.items():
        rows[family] = {}
        for name in CONTENDERS:
            rows[family].update(_run(name, family, folder))
        print(family, json.dumps(rows[family]))
    columns = list(dict.fromkeys(c for r in rows.values() for c in r))
    lines += ["", "| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for family, r in rows.items():
        cells = [f"{r[c]:.0f}" if c in r else "" for c in columns]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines.append(f"\n(tokens/s; load average at the end {_load()})")
    for family, r in rows.items():
        if "linstream f32" in r:
            ratios = ", ".join(
                f"{r['linstream f32'] / r[c]:.2f}x {c}"
                for c in columns
                if c in r and c != "linstream f32"
            )
            lines.append(f"{family}: linstream f32 = {ratios}")
    print("\n" + "\n".join(lines))
    for family, r in rows.items():
        assert all(v > 0 for v in r.values()), (family, r)


@pytest.mark.bench
def test_a_build_that_cannot_finish_says_which_step_in_one_line(tmp_path):
    """No time left: the first step (the sdist's download) is refused in one line naming it and
    its log, and no ready mark is left, so the next call starts over."""
    from helpers.llama_cpp import LLAMA_CPP_PYTHON_VERSION, LlamaCppError, ensure_llama_cpp

    with pytest.raises(LlamaCppError, match=r"pip download llama-cpp-python==.*no time left") as e:
        ensure_llama_cpp(cache=tmp_path, timeout_s=0)
    assert "\n" not in str(e.value) and "build.log" in str(e.value)
    assert not (tmp_path / LLAMA_CPP_PYTHON_VERSION / "READY.json").exists()


# -- the parser, checked without llama.cpp (runs in `make test`) --------------------------------
def test_llama_bench_json_parses_to_tokens_per_second():
    """llama-bench -o json's fields (as commit 0c1e57098 prints them) become a BenchResult."""
    row = {
        "build_commit": "0c1e570",
        "model_type": "rwkv7 ?B all F32",
        "model_n_params": 380160,
        "n_ubatch": 512,
        "n_threads": 2,
        "n_prompt": 128,
        "n_gen": 0,
        "avg_ns": 7099307,
        "stddev_ns": 6714280,
        "avg_ts": 33385.121883,
        "stddev_ts": 24806.157423,
        "samples_ts": [20524.9, 61858.7, 19761, 57862.6, 6918.38],
    }
    [r] = parse_llama_bench_json(json.dumps([row]))
    assert r == BenchResult(
        128,
        0,
        2,
        512,
        33385.121883,
        24806.157423,
        (20524.9, 61858.7, 19761.0, 57862.6, 6918.38),
        "rwkv7 ?B all F32",
        380160,
        "0c1e570",
    )
    assert r.best_tok_s == 61858.7


def test_llama_bench_output_without_its_fields_is_one_line():
    from helpers.llama_cpp import LlamaCppError

    with pytest.raises(LlamaCppError, match=r"test 0: expected the keys .*avg_ts") as e:
        parse_llama_bench_json('[{"n_prompt": 2048}]')
    assert "\n" not in str(e.value)
    with pytest.raises(LlamaCppError, match="expected a JSON array"):
        parse_llama_bench_json("| model | size |")


if __name__ == "__main__":
    print(json.dumps(CONTENDERS[sys.argv[1]](sys.argv[2], sys.argv[3])))
