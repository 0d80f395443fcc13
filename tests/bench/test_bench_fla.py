"""Benchmark: a ~110M-parameter fla checkpoint (random bfloat16 weights, GLA and DeltaNet)
streamed in chunks of 2,048 tokens: linstream's runtime against fla's own forward on the CPU
(its naive references, torch, 2 threads) and against a plain PyTorch recurrent loop.

    .venv/bin/python -m pytest tests/bench/test_bench_fla.py -m bench -s -p no:randomly

Each contender runs in a fresh process on the same folder and the same tokens (so each
process's peak RSS is its own), in the order linstream, PyTorch loop, fla, linstream again (the
machine is shared: the two linstream runs bracket the others, and the table shows both).
linstream: float32 compute, float64 state, a warm-up chunk first (Numba's compilation), then
CHUNKS chunks carrying the state, each chunk run twice in turn: with the runtime's thread
layout (BLAS at one thread, a chunk's rows split across the two threads) and with BLAS's own
two threads per product (the layout before; same outputs), so the two are compared in one
process at the same moments.  fla: `AutoModel` (hidden states, no output head) in float32
under no_grad with torch at 2 threads, two consecutive chunks carrying its cache: the first call
in the process ("cold") and the next ("warm"; its recurrence is a Python loop over the tokens,
which has run up to ten times slower on a first call here).  The PyTorch loop: the same layers
in plain torch (projections and MLP over the chunk, the recurrence one token at a time), one
chunk after a 64-token warm-up; its outputs are checked against linstream's before it is
timed.  Memory per live sequence is the carried state (`FlaModel.state_nbytes()`, float64),
whatever the sequence's length.  The target is
linstream ≥ 5× fla's CPU path; the test prints the ratio against it and asserts only that
linstream is the faster (see docs/benchmarks.md for why 5× is out of reach at this size).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

CHUNK = 2048
CHUNKS = 2
SEED = 7
TARGET = 5.0
CONFIGS = {
    # 109.8M parameters (85.2M without the embeddings), as the research measured fla on
    "gla": {"model_type": "gla", "hidden_size": 768, "num_hidden_layers": 12, "num_heads": 4,
            "expand_k": 0.5, "expand_v": 1.0, "vocab_size": 32000},
    "delta_net": {"model_type": "delta_net", "hidden_size": 768, "num_hidden_layers": 12,
                  "num_heads": 12, "vocab_size": 32000},
}  # fmt: skip


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _tokens(n: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, 32000, n)


# -- contenders (each runs in its own process) -------------------------------------------------
class _Clock:
    """Accumulates the wall time of calls to the functions it wraps (the recurrences)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        return timed


def _matmul_gflops() -> float:
    """The MLP's gate|up product of this model, [2048, 768] @ [768, 4096] float32, with NumPy."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CHUNK, 768), dtype=np.float32)
    w = rng.standard_normal((4096, 768), dtype=np.float32)
    x @ w.T
    best = min(_timed(lambda: x @ w.T) for _ in range(3))
    return 2 * CHUNK * 768 * 4096 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_linstream(folder: str) -> dict:
    import contextlib

    from linstream.ops.model import blas
    from linstream.ops.model.fla import delta_net, gla, load_model, runtime
    from linstream.ops.model.threads import row_split

    clock = _Clock()
    gla.vector_gated_chunks = clock.wrap(gla.vector_gated_chunks)
    delta_net.delta_chunks = clock.wrap(delta_net.delta_chunks)
    model = load_model(folder)
    ids = _tokens((CHUNKS + 1) * CHUNK)
    emb, _ = model.embed_chunk(ids[:CHUNK], None)  # warm-up: compiles the kernels
    np.save(Path(folder) / "linstream_first.npy", emb[:64])
    gflops = _matmul_gflops()
    # "rows": the runtime's layout; "blas2": BLAS's own two threads per product (the layout
    # before, for its speed: it rounds differently); "one": the runtime's on one thread, whose
    # outputs and states must be those of "rows", bit for bit
    layouts = {
        "rows": runtime._thread_layout,
        "blas2": lambda: (contextlib.nullcontext(), None),
        "one": lambda: (blas._single_threaded_blas(), row_split(1)),
    }
    states: dict = dict.fromkeys(layouts)
    seconds, in_recurrence = dict.fromkeys(layouts, 0.0), 0.0
    for i in range(CHUNKS):
        for name, layout in layouts.items():
            runtime._thread_layout = layout
            clock.seconds = 0.0
            t0 = time.perf_counter()
            _, states[name] = model.embed_chunk(ids[i * CHUNK : (i + 1) * CHUNK], states[name])
            seconds[name] += time.perf_counter() - t0
            in_recurrence += clock.seconds if name == "rows" else 0.0
    same = all(
        np.array_equal(a[k], b[k])
        for a, b in zip(states["rows"], states["one"], strict=True)
        for k in a
    )
    dt = seconds["rows"]
    return {
        "tokens_per_s": CHUNKS * CHUNK / dt,
        "tokens_per_s_blas2": CHUNKS * CHUNK / seconds["blas2"],
        "same_states": same,
        "recurrence_share": in_recurrence / dt,
        "matmul_gflops": gflops,
        "state_bytes": model.state_nbytes(),
        "peak_rss": _hwm(),
        "load": str(model.load_report),
    }


def run_fla(folder: str) -> dict:
    """fla's forward on two consecutive chunks carrying its cache: the first call in a fresh
    process ("cold") and the next ("warm"); fla's CPU path has run several times slower on a
    first call than on later ones here, so both are reported."""
    import fla.layers.delta_net as fdn
    import fla.layers.gla as fgla
    import torch
    from helpers.fla_oracle import patch_fla_for_cpu
    from transformers import AutoModel

    patch_fla_for_cpu()
    clock = _Clock()
    for mod, names in ((fgla, ("chunk_gla", "fused_recurrent_gla")),
                       (fdn, ("chunk_delta_rule", "fused_recurrent_delta_rule"))):  # fmt: skip
        for n in names:
            setattr(mod, n, clock.wrap(getattr(mod, n)))
    torch.set_num_threads(2)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.as_tensor(_tokens(2 * CHUNK))[None]
    out: dict = {}
    with torch.no_grad():
        cache = None
        for name, part in (("cold", ids[:, :CHUNK]), ("warm", ids[:, CHUNK:])):
            clock.seconds = 0.0
            t0 = time.perf_counter()
            res = model(part, past_key_values=cache, use_cache=True)
            dt = time.perf_counter() - t0
            cache = res.past_key_values
            out[name] = {"tokens_per_s": CHUNK / dt, "recurrence_share": clock.seconds / dt}
            if name == "cold":
                got = res.last_hidden_state[0, :64].numpy()
    ref = np.load(Path(folder) / "linstream_first.npy")
    return {**out, "peak_rss": _hwm(), "max_diff_vs_linstream": _rel(got, ref)}


def run_torch_loop(folder: str) -> dict:
    import torch

    torch.set_num_threads(2)
    cfg = json.loads((Path(folder) / "config.json").read_text())
    w = _torch_weights(folder)
    ids = torch.as_tensor(_tokens(CHUNK))
    with torch.no_grad():
        first = _torch_forward(cfg, w, ids[:64]).numpy()  # also its warm-up
        t0 = time.perf_counter()
        _torch_forward(cfg, w, ids)
        dt = time.perf_counter() - t0
    ref = np.load(Path(folder) / "linstream_first.npy")
    return {
        "tokens_per_s": CHUNK / dt,
        "peak_rss": _hwm(),
        "max_diff_vs_linstream": _rel(first, ref),
    }


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.linalg.norm(a - b, axis=1) / np.linalg.norm(b, axis=1)))


def _torch_weights(folder: str) -> dict:
    from safetensors.torch import load_file

    return {
        k.removeprefix("model."): v.float()
        for k, v in load_file(f"{folder}/model.safetensors").items()
    }


def _torch_forward(cfg: dict, w: dict, ids):
    """The model in plain torch, the recurrence one token at a time (the loop a PyTorch user
    writes).  GLA without short convs, DeltaNet with them, as CONFIGS define them."""
    import torch
    import torch.nn.functional as F

    eps = 1e-6

    def rms(x, wt, e=eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + e) * wt

    x = w["embeddings.weight"][ids]
    t = x.shape[0]
    h = cfg["num_heads"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        a = p + "attn."
        xn = rms(x, w[p + "attn_norm.weight"])
        q, k, v = (xn @ w[f"{a}{n}_proj.weight"].T for n in "qkv")
        if cfg["model_type"] == "gla":
            gk = F.logsigmoid((xn @ w[a + "gk_proj.0.weight"].T) @ w[a + "gk_proj.1.weight"].T
                              + w[a + "gk_proj.1.bias"]) / 16  # fmt: skip
            q, k, gk = (z.view(t, h, -1) for z in (q, k, gk))
            v = v.view(t, h, -1)
            q = q * q.shape[-1] ** -0.5
            s = torch.zeros(h, q.shape[-1], v.shape[-1])
            o = torch.empty_like(v)
            for j in range(t):
                s = s * gk[j].exp()[:, :, None] + k[j][:, :, None] * v[j][:, None, :]
                o[j] = torch.einsum("hk,hkv->hv", q[j], s)
            g = xn @ w[a + "g_proj.weight"].T
            o = rms(o, w[a + "g_norm_swish_gate.weight"]) * F.silu(g.view_as(o))
        else:

            def conv(z, name, a=a):
                wt = w[a + f"{name}_conv1d.weight"]
                zz = F.pad(z.T[None], (wt.shape[-1] - 1, 0))
                return F.silu(F.conv1d(zz, wt, groups=z.shape[1])[0].T)

            q, k, v = conv(q, "q"), conv(k, "k"), conv(v, "v")
            q, k, v = (z.view(t, h, -1) for z in (q, k, v))
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) * q.shape[-1] ** -0.5
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            beta = torch.sigmoid(xn @ w[a + "b_proj.weight"].T)
            s = torch.zeros(h, q.shape[-1], v.shape[-1])
            o = torch.empty_like(v)
            for j in range(t):
                u = beta[j][:, None] * (v[j] - torch.einsum("hkv,hk->hv", s, k[j]))
                s = s + k[j][:, :, None] * u[:, None, :]
                o[j] = torch.einsum("hk,hkv->hv", q[j], s)
            o = rms(o, w[a + "o_norm.weight"])
        x = x + o.reshape(t, -1) @ w[a + "o_proj.weight"].T
        xn = rms(x, w[p + "mlp_norm.weight"])
        gate, up = xn @ w[p + "mlp.gate_proj.weight"].T, xn @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["norm.weight"])


CONTENDERS = {"linstream": run_linstream, "torch_loop": run_torch_loop, "fla": run_fla}


# -- the benchmark --------------------------------------------------------------------------------
def _run(contender: str, folder: Path) -> dict:
    tests_dir = str(Path(__file__).resolve().parents[1])  # the child imports helpers.*
    r = subprocess.run(
        [sys.executable, __file__, contender, str(folder)],
        capture_output=True, text=True, check=False, timeout=1800,
        env={**os.environ, "PYTHONPATH": tests_dir},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


@pytest.mark.bench
def test_bench_fla_families(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("fla")
    from helpers.fla_folders import write_folder

    mib = 1 << 20
    lines = [
        f"{CHUNK}-token chunks, float32 compute, 2 threads each; {platform.machine()}, "
        f"{os.cpu_count()} CPUs; load average at the start {_load()}",
        "",
        "| model | linstream tok/s (before / after) | linstream, BLAS on 2 threads (before / "
        "after) | fla tok/s (cold / warm) | PyTorch loop tok/s | linstream / fla (cold / warm) "
        "| linstream / loop | time in the recurrence (linstream / fla warm) | state per "
        "sequence | peak RSS (linstream / fla / loop) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios, notes = {}, []
    for family, cfg in CONFIGS.items():
        folder = write_folder(tmp_path / family, cfg, dtype="BF16", seed=SEED)
        a = _run("linstream", folder)
        loop = _run("torch_loop", folder)
        fla = _run("fla", folder)
        b = _run("linstream", folder)
        print(family, json.dumps({"linstream": [a, b], "loop": loop, "fla": fla}))
        # the contenders must agree before their speeds mean anything (float32, 64 tokens)
        assert fla["max_diff_vs_linstream"] < 1e-4 and loop["max_diff_vs_linstream"] < 1e-4
        assert a["same_states"] and b["same_states"]  # on two threads or one, the same bits
        lin = min(a["tokens_per_s"], b["tokens_per_s"])
        cold, warm = fla["cold"]["tokens_per_s"], fla["warm"]["tokens_per_s"]
        ratios[family] = lin / warm
        params = a["load"].split(", ")[1].split(" from")[0]
        lines.append(
            f"| {family} ({params}) | {a['tokens_per_s']:.0f} / {b['tokens_per_s']:.0f} | "
            f"{a['tokens_per_s_blas2']:.0f} / {b['tokens_per_s_blas2']:.0f} | "
            f"{cold:.0f} / {warm:.0f} | {loop['tokens_per_s']:.0f} | "
            f"{lin / cold:.1f}× / {lin / warm:.1f}× | {lin / loop['tokens_per_s']:.1f}× | "
            f"{a['recurrence_share']:.0%} / {fla['warm']['recurrence_share']:.0%} | "
            f"{a['state_bytes'] / mib:.2f} MiB | {a['peak_rss'] / mib:.0f} / "
            f"{fla['peak_rss'] / mib:.0f} / {loop['peak_rss'] / mib:.0f} MiB |"
        )
        notes.append(
            f"{family}: NumPy's float32 [2048, 768] @ [768, 4096] ran at "
            f"{a['matmul_gflops']:.0f} / {b['matmul_gflops']:.0f} GFLOP/s in the two linstream runs"
        )
    lines += ["", *notes, f"load average at the end {_load()}"]
    print("\n" + "\n".join(lines))
    for family, ratio in ratios.items():
        print(f"{family}: linstream / fla (warm) = {ratio:.2f}, target {TARGET}")
        assert ratio >= 1.0, (family, ratio)


if __name__ == "__main__":
    print(json.dumps(CONTENDERS[sys.argv[1]](sys.argv[2])))
