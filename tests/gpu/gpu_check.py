#!/usr/bin/env python3
"""GPU check of linstream's CUDA kernels: correctness, then throughput against their rivals.

    python tests/gpu/gpu_check.py          (or `make gpu-check`; not yet run on a device: its
                                            own budget skips the last throughput rows past 7 min)

1. Correctness of the additive CuPy backend: `cupy_causal` against the float64 oracle over random
   chunk splits (the seeds are printed), float32 / bfloat16 / float64 inputs, several feature maps
   and chunk sizes.
1b. Correctness of the update rules' kernels (decay/gated, vector-gated, delta/gated_delta;
   gpu_check_rules.py): against the float64 references over random splits, two runs giving the
   same bits, bfloat16 inputs giving exactly the float32 results of their values, and fixed cases
   against the Numba kernels (live where Numba imports, else from a file prepared here).
1c. The same for Mamba-2's SSD scan and RWKV-7's DPLR rule (gpu_check_ssd_dplr.py); the SSD
   reference, transformers' float64 scan, comes from the same prepared folder (or live where
   transformers imports).
2-3. Throughput of the additive backend for H=16, d=64, T=65536, float32 and bfloat16 inputs, on
   the same data: linstream's CuPy backend; a PyTorch CUDA chunked implementation of the same
   chunkwise form (below); and, when `fla` imports, flash-linear-attention's `chunk_linear_attn`
   carrying its state (never a linstream dependency); then its stages one by one.
3b. Throughput of the SSD kernel (Mamba-2 130M's heads) and the DPLR kernel (RWKV-7's heads;
   beside fla's Triton chunk_dplr_delta_rule, with their agreement), T=16,384.
4. Throughput of each rule's kernel (H=16, d=64, T=16,384) and of fla's Triton chunk kernel for
   the same rule, with their agreement.  fla's autotuning is pruned to 4 configurations per
   kernel to fit the budget (GPU_CHECK_FLA_FULL_AUTOTUNE=1 keeps all).
It prints tables and writes `$OUT/gpu_check.json` when OUT is set.  Without a usable CUDA device
it says so and exits 0.  Exit 1 when a correctness check fails; each failure names the rule (or
backend), the kernel and the worst error.

On a machine with internet: `pip install -e '.[gpu,torch]' flash-linear-attention` and run it.
On the project's device machine (no network; python3 there has torch, triton, cupy-cuda13x,
numpy, and no Numba) this script runs as part of tests/gpu/gpu_check_all.py (`make gpu-check`:
this check and the fla families' under one 9-minute budget), whose `make gpu-prepare` here
downloads the wheels (build/whl) and prepares the Numba kernels' outputs
(`--prepare-numba build/gpu-check/numba_rules.npz`, below) and prints the device command.
Alone, after `make gpu-prepare`:

    # there: run(command=..., carry=["build/whl", "build/gpu-check"], timeout_s=540)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        build/whl/*.whl && export PYTHONPATH=/tmp/site; \
        PYTHONUNBUFFERED=1 python3 tests/gpu/gpu_check.py

linstream needs no install there: this script exposes the source tree as `linstream.*` (and
tests/ on sys.path for the test helpers it shares with the suite).

The fla checkpoint families' GPU runtime (the CuPy runtime against the CPU runtime and fla's
forward, the CPU→GPU handoff, tokens/s at 2,048-token chunks) is tests/gpu/gpu_check_fla.py;
gpu_check_all.py runs both (setup, correctness and speed below are its pieces).
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 200.0  # stop the additive part's optional sections past this
RULES_DEADLINE_S = 420.0  # stop the rules' throughput rows past this: the run ends within 7 min
NUMBA_REFS = os.environ.get("GPU_CHECK_NUMBA_REFS", str(ROOT / "build/gpu-check/numba_rules.npz"))
# transformers' SSD scan and the Numba SSD / DPLR outputs, prepared beside NUMBA_REFS
SSD_DPLR_REFS = str(Path(NUMBA_REFS).with_name("ssd_dplr_refs.npz"))
T0 = time.perf_counter()
H, D, T = 16, 64, 65536
CHUNK = 64
EPS = 1e-6
# GPU_CHECK_CPU_DRYRUN=1: run this script's own logic on the CPU (NumPy standing in for CuPy,
# PyTorch on the CPU, small shapes) so that it is tested before its one shot on a GPU.
DRY_RUN = os.environ.get("GPU_CHECK_CPU_DRYRUN", "") not in ("", "0")


def _import_linstream() -> None:
    """Use the installed linstream, or expose this source tree as the `linstream` namespace;
    tests/ goes on sys.path for the helpers shared with the suite (tests/helpers)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    try:
        import linstream.ops
    except ImportError:
        top = Path(tempfile.mkdtemp(prefix="linstream-src-")) / "linstream"
        top.mkdir()
        for sub in ("ops", "state", "pipeline"):
            (top / sub).symlink_to(ROOT / sub, target_is_directory=True)
        sys.path.insert(0, str(top.parent))
        import linstream.ops  # noqa: F401


def _numpy_as_cupy() -> Any:
    """A stand-in `cupy` module made of NumPy (dry run only), and cupy_causal pointed at it."""
    import types

    from linstream.ops.additive import cupy as cupy_backend

    shim = types.ModuleType("cupy_dry_run")
    shim.__getattr__ = lambda name: getattr(np, name)  # type: ignore[method-assign]
    shim.__version__ = "numpy stand-in"
    shim.ndarray = np.ndarray  # type: ignore[attr-defined]
    shim.asnumpy = np.asarray  # type: ignore[attr-defined]
    device = types.SimpleNamespace(id=0, synchronize=lambda: None)
    props = {"name": b"CPU dry run (NumPy stands in for CuPy)"}
    shim.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Device=lambda *a: device,
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: props),
    )
    launcher = types.SimpleNamespace(xp=shim, to_host=np.asarray)
    cupy_backend.cupy_launcher = lambda: launcher  # type: ignore[assignment]
    cupy_backend._cupy_kernels = lambda: cupy_backend.NumpyKernels(np)  # type: ignore[assignment]
    return shim


def _cupy() -> Any:
    if DRY_RUN:
        return _numpy_as_cupy()
    import cupy

    return cupy


def _write_json(report: dict[str, Any]) -> None:
    out = os.environ.get("OUT")
    if out:
        path = Path(out) / "gpu_check.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, default=str))
        print(f"gpu_check: wrote {path}")


def _elapsed() -> float:
    return time.perf_counter() - T0


# ---- error measures ---------------------------------------------------------------------------


def token_error(out: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max, mean) over tokens and heads of ‖o − o_ref‖ / max(‖o_ref‖, 1e-2)."""
    out = np.asarray(out, dtype=np.float64)
    err = np.linalg.norm(out - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-2)
    return float(err.max()), float(err.mean())


def bf16_bits(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round float32 to bfloat16 (nearest even): (uint16 bits, the float32 values they hold)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---- 1. correctness ------------------------------------------------------------------------------


def check_random_splits(n_cases: int, seed: int) -> list[dict[str, Any]]:
    from linstream.ops.additive.cupy import Bfloat16Bits, cupy_causal
    from linstream.ops.additive.naive import causal_recurrent
    from linstream.ops.attention_state import AttentionState

    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_cases):
        cs = int(rng.integers(0, 2**32 - 1))
        r = np.random.default_rng(cs)
        t = int(r.integers(1, 300 if DRY_RUN else 3000))
        h = int(r.integers(1, 9))
        d = int(r.choice([16, 64]))
        c = int(r.choice([16, 64, 128]))
        kind = str(r.choice(["float32", "bfloat16", "float64"]))
        fmap = str(r.choice(["elu+1", "relu"]))
        q, k, v = (r.standard_normal((t, h, d)) for _ in range(3))
        if fmap == "relu":
            q, k = q + 1.5, k + 1.5  # keep denominators away from zero
        n0 = int(r.integers(0, 100))
        s0 = AttentionState(r.uniform(-0.5, 0.5, (h, d, d)) * n0, r.uniform(0.5, 1, (h, d)) * n0)
        if kind == "bfloat16":
            (qb, qx), (kb, kx), (vb, vx) = (bf16_bits(x) for x in (q, k, v))
            inputs: tuple[Any, ...] = (Bfloat16Bits(qb), Bfloat16Bits(kb), Bfloat16Bits(vb))
            exact = (qx, kx, vx)
        else:
            inputs = tuple(x.astype(kind) for x in (q, k, v))
            exact = inputs
        ref, ref_state = causal_recurrent(*exact, s0, feature_map=fmap, eps=EPS)
        cuts = sorted(set(r.integers(0, t + 1, int(r.integers(0, 8))).tolist()))
        bounds = [0, *cuts, t]
        state, outs = s0, []
        for s, e in itertools.pairwise(bounds):
            if e > s:
                part = tuple(
                    Bfloat16Bits(x.bits[s:e]) if isinstance(x, Bfloat16Bits) else x[s:e]
                    for x in inputs
                )
                o, state = cupy_causal(*part, state, feature_map=fmap, eps=EPS, chunk_size=c)
                outs.append(o)
        err_max, _err_mean = token_error(np.concatenate(outs), ref)
        s_err = float(np.abs(state.S - ref_state.S).max() / max(1.0, np.abs(ref_state.S).max()))
        z_err = float(np.abs(state.z - ref_state.z).max() / max(1.0, np.abs(ref_state.z).max()))
        tol = 1e-10 if kind == "float64" else 2e-5
        ok = err_max <= tol and s_err <= tol and z_err <= tol
        rows.append(
            {
                "seed": cs,
                "T": t,
                "H": h,
                "d": d,
                "chunk_size": c,
                "dtype": kind,
                "feature_map": fmap,
                "splits": bounds,
                "err_max": err_max,
                "state_err": max(s_err, z_err),
                "tol": tol,
                "ok": ok,
            }
        )
        mark = "ok  " if ok else "FAIL"
        print(
            f"  {mark} seed={cs:<10d} T={t:<5d} H={h} d={d:<2d} C={c:<3d} {kind:<8s} {fmap:<5s} "
            f"pieces={len(bounds) - 1}  out err {err_max:.2e}  state err {max(s_err, z_err):.2e}"
        )
    return rows


# ---- 2. rivals -----------------------------------------------------------------------------------


def torch_chunked(q: Any, k: Any, v: Any, sx0: Any, *, c: int = CHUNK, eps: float = EPS) -> Any:
    """PyTorch CUDA chunked causal linear attention (elu+1), the same chunkwise form as linstream:
    q, k [T, H, d], v [T, H, d_v] (any float dtype, computed in float32); sx0 [H, F, d_v + 1]
    float64 = S | z.  Returns (out [T, H, d_v] float32, the new S | z float64)."""
    import torch
    import torch.nn.functional as F

    t, h, d = q.shape
    dv = v.shape[2]
    n = -(-t // c)
    tp = n * c

    def head_major(x: Any, width: int, ones: bool) -> Any:
        y = torch.zeros((h, tp, width), dtype=torch.float32, device=x.device)
        y[:, :t, : x.shape[2]] = x.transpose(0, 1)
        if ones:
            y[:, :t, -1] = 1
        return y.view(h, n, c, width)

    q4 = head_major(F.elu(q.float()) + 1, d, False)
    k4 = head_major(F.elu(k.float()) + 1, d, False)
    v4 = head_major(v.float(), dv + 1, True)
    ds = k4.transpose(-1, -2) @ v4  # [H, N, F, d_v + 1]
    cs = torch.cumsum(ds, dim=1, dtype=torch.float64)
    pre = torch.empty_like(cs)
    pre[:, 0] = sx0
    pre[:, 1:] = cs[:, :-1] + sx0[:, None]
    nd = q4 @ pre.float() + torch.tril(q4 @ k4.transpose(-1, -2)) @ v4
    nd = nd.reshape(h, tp, dv + 1)[:, :t]
    out = (nd[..., :dv] / (nd[..., dv:] + eps)).transpose(0, 1)
    return out, sx0 + cs[:, -1]


class FlaRunner:
    """fla's chunk_linear_attn with its state carried: φ = elu+1 applied first, scale 1.

    fla >= 0.6 carries the normalizer itself (normalize=True, state (kv, z)); older versions only
    carry kv, so there the denominator rides as an extra ones column of v (normalize=False)."""

    def __init__(self) -> None:
        from fla.ops.linear_attn import chunk_linear_attn

        self.fn = chunk_linear_attn
        self.mode = "normalize=True, state (kv, z)"

    def __call__(self, q: Any, k: Any, v: Any, s0: Any, z0: Any) -> Any:
        import torch.nn.functional as F

        qf = (F.elu(q) + 1).unsqueeze(0)
        kf = (F.elu(k) + 1).unsqueeze(0)
        if self.mode.startswith("normalize=True"):
            try:
                o, (kv, z) = self.fn(
                    qf,
                    kf,
                    v.unsqueeze(0),
                    scale=1.0,
                    initial_state=(s0[None], z0[None, None]),
                    output_final_state=True,
                    normalize=True,
                )
                return o[0], kv[0], z[0, 0]
            except (TypeError, ValueError, AttributeError, RuntimeError):
                self.mode = "normalize=False, ones column for z (older fla)"
        import torch

        ones = torch.ones((*v.shape[:2], 1), dtype=v.dtype, device=v.device)
        vx = torch.cat([v, ones], dim=-1).unsqueeze(0)
        sx = torch.cat([s0, z0[..., None]], dim=-1)[None]
        o, sxn = self.fn(
            qf, kf, vx, scale=1.0, initial_state=sx, output_final_state=True, normalize=False
        )
        out = o[0, ..., :-1].float() / (o[0, ..., -1:].float() + EPS)
        return out, sxn[0, ..., :-1], sxn[0, ..., -1]


def timed(fn: Any, sync: Any, reps: int, warmup: int = 3) -> float:
    """Median wall time (s) of fn() with the device synchronised around each call."""
    if DRY_RUN:
        reps, warmup = 2, 1
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def throughput(report: dict[str, Any]) -> bool:
    cp = _cupy()
    from linstream.ops.additive.cupy import Bfloat16Bits, cupy_causal
    from linstream.ops.additive.naive import causal_recurrent
    from linstream.ops.attention_state import AttentionState

    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    fla = None
    on_gpu = torch is not None and torch.cuda.is_available()
    use_torch = torch is not None and (on_gpu or DRY_RUN)
    if on_gpu:
        try:
            import gpu_check_rules

            report["versions"]["fla_autotune"] = gpu_check_rules.prune_fla_autotune()
            fla = FlaRunner()
            import fla as fla_pkg

            report["versions"]["fla"] = getattr(fla_pkg, "__version__", "?")
        except Exception as ex:  # not installed, or no Triton: the row is simply absent
            report["versions"]["fla"] = f"unavailable: {type(ex).__name__}: {ex}"
            fla = None
    else:
        report["versions"]["torch_cuda"] = "unavailable"

    rng = np.random.default_rng(20261130)
    q32, k32, v32 = (rng.standard_normal((T, H, D)).astype(np.float32) for _ in range(3))
    s0 = AttentionState(rng.uniform(-0.5, 0.5, (H, D, D)) * 100, rng.uniform(0.5, 1, (H, D)) * 100)
    bf = [bf16_bits(x) for x in (q32, k32, v32)]
    print(f"\n[2] reference: causal_recurrent float64, H={H} d={D} T={T} (host) ...", flush=True)
    t_ref = time.perf_counter()
    ref32, _ = causal_recurrent(q32, k32, v32, s0, feature_map="elu+1", eps=EPS)
    refbf, _ = causal_recurrent(*(x for _, x in bf), s0, feature_map="elu+1", eps=EPS)
    print(f"    references took {time.perf_counter() - t_ref:.1f} s", flush=True)

    def sync() -> None:
        cp.cuda.Device().synchronize()
        if on_gpu:
            torch.cuda.synchronize()

    rows: list[dict[str, Any]] = []

    def add(name: str, dtype: str, fn: Any, ref: np.ndarray, reps: int = 20) -> None:
        if _elapsed() > BUDGET_S:
            print(f"    skipped {name} ({dtype}): time budget spent")
            return
        try:
            out = fn()
            sync()
            err_max, err_mean = token_error(_host(out), ref)
            sec = timed(fn, sync, reps)
        except Exception as ex:
            print(f"    {name} ({dtype}) failed: {type(ex).__name__}: {ex}")
            rows.append({"impl": name, "dtype": dtype, "error": f"{type(ex).__name__}: {ex}"})
            return
        row = {
            "impl": name,
            "dtype": dtype,
            "ms": sec * 1e3,
            "tokens_per_s": T / sec,
            "head_tokens_per_s": T * H / sec,
            "err_max": err_max,
            "err_mean": err_mean,
        }
        rows.append(row)
        print(
            f"    {name:<44s} {dtype:<8s} {sec * 1e3:8.3f} ms  {T / sec / 1e6:8.2f} M tok/s  "
            f"err max {err_max:.1e}",
            flush=True,
        )

    def _host(out: Any) -> np.ndarray:
        if isinstance(out, cp.ndarray):
            return cp.asnumpy(out)
        if torch is not None and isinstance(out, torch.Tensor):
            return out.float().cpu().numpy()
        return np.asarray(out)

    print(f"\n[2] throughput, H={H} d={D} T={T} (one sequence, state carried in and out)")
    dq, dk, dvv = (cp.asarray(x) for x in (q32, k32, v32))
    dst = AttentionState(cp.asarray(s0.S), cp.asarray(s0.z))
    add(
        "linstream cupy (device arrays)",
        "float32",
        lambda: cupy_causal(dq, dk, dvv, dst, chunk_size=CHUNK)[0],
        ref32,
    )
    bq, bk, bv = (Bfloat16Bits(cp.asarray(b)) for b, _ in bf)
    add(
        "linstream cupy (device arrays)",
        "bfloat16",
        lambda: cupy_causal(bq, bk, bv, dst, chunk_size=CHUNK)[0],
        refbf,
    )

    def streamed(n_calls: int) -> Any:
        state, outs, step = dst, [], T // n_calls
        for s in range(0, T, step):
            o, state = cupy_causal(dq[s : s + step], dk[s : s + step], dvv[s : s + step], state)
            outs.append(o)
        return cp.concatenate(outs)

    add(f"linstream cupy, 16 calls x {T // 16} tokens", "float32", lambda: streamed(16), ref32, 10)
    add(
        "linstream cupy (host numpy in/out)",
        "float32",
        lambda: cupy_causal(q32, k32, v32, s0, chunk_size=CHUNK)[0],
        ref32,
        10,
    )
    if use_torch:
        torch.backends.cuda.matmul.allow_tf32 = False
        dev = torch.device("cuda" if on_gpu else "cpu")
        tq, tk, tv = (torch.from_numpy(x).to(dev) for x in (q32, k32, v32))
        tqb, tkb, tvb = (torch.from_numpy(x).to(dev).to(torch.bfloat16) for _, x in bf)
        sx0 = torch.from_numpy(np.concatenate([s0.S, s0.z[..., None]], -1)).to(dev)
        add(
            "pytorch chunked (same form, fp32 matmuls)",
            "float32",
            lambda: torch_chunked(tq, tk, tv, sx0)[0],
            ref32,
        )
        add(
            "pytorch chunked (same form, fp32 matmuls)",
            "bfloat16",
            lambda: torch_chunked(tqb, tkb, tvb, sx0)[0],
            refbf,
        )
        if fla is not None:
            fs0 = torch.from_numpy(s0.S).to(dev, torch.float32)
            fz0 = torch.from_numpy(s0.z).to(dev, torch.float32)
            runner = fla
            add("fla chunk_linear_attn", "float32", lambda: runner(tq, tk, tv, fs0, fz0)[0], ref32)
            add(
                "fla chunk_linear_attn",
                "bfloat16",
                lambda: runner(tqb, tkb, tvb, fs0, fz0)[0],
                refbf,
            )
            report["fla_mode"] = runner.mode
            print(f"    fla mode: {runner.mode}")
    report["throughput"] = rows
    _ratios(report, rows)
    if _elapsed() < BUDGET_S:
        report["stages"] = stage_breakdown(dq, dk, dvv, dst, sync)
    return True


def stage_breakdown(dq: Any, dk: Any, dv: Any, st: Any, sync: Any) -> dict[str, float]:
    """Median ms of each stage of one float32 cupy_causal call at the throughput shape, so a
    later run shows where the time goes (each stage timed alone, on the same data)."""
    from linstream.ops.additive import cupy as cb
    from linstream.ops.feature_maps import get_feature_map

    cp = _cupy()
    kern = cb._cupy_kernels()
    fm = get_feature_map("elu+1")
    n = -(-T // CHUNK)
    tp = n * CHUNK
    f32 = np.dtype(np.float32)
    sx = cp.concatenate([cp.asarray(st.S), cp.asarray(st.z)[..., None]], axis=-1)
    qh = kern.prep(dq, "float32", fm, f32, tp, "q")
    kh = kern.prep(dk, "float32", fm, f32, tp, "k")
    vx = kern.prep(dv, "float32", fm, f32, tp, "v")
    q4, k4 = qh.reshape(H, n, CHUNK, D), kh.reshape(H, n, CHUNK, D)
    v4 = vx.reshape(H, n, CHUNK, D + 1)
    ds = cp.matmul(k4.swapaxes(2, 3), v4)
    pre, _ = kern.scan(ds, sx, f32)
    inter = cp.matmul(q4, pre)
    a = cp.matmul(q4, k4.swapaxes(2, 3))
    stages = {
        "prep q (feature map, layout)": lambda: kern.prep(dq, "float32", fm, f32, tp, "q"),
        "prep v (ones column)": lambda: kern.prep(dv, "float32", fm, f32, tp, "v"),
        "dS = K^T [V|1] (cuBLAS)": lambda: cp.matmul(k4.swapaxes(2, 3), v4),
        "state_scan (float64)": lambda: kern.scan(ds, sx, f32),
        "Q S_n (cuBLAS)": lambda: cp.matmul(q4, pre),
        "A = Q K^T (cuBLAS)": lambda: cp.matmul(q4, k4.swapaxes(2, 3)),
        "intra_norm (fused)": lambda: kern.intra(a, vx, inter.reshape(H, tp, D + 1), EPS, T),
    }
    out: dict[str, float] = {}
    print(f"\n[3] stages of one float32 call, H={H} d={D} T={T} C={CHUNK} (each alone)")
    for name, fn in stages.items():
        try:
            ms = timed(fn, sync, 10) * 1e3
        except Exception as ex:
            print(f"    {name:<32s} failed: {type(ex).__name__}: {ex}")
            continue
        out[name] = ms
        print(f"    {name:<32s} {ms:8.3f} ms")
    return out


def _ratios(report: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    def rate(impl: str, dtype: str) -> float | None:
        for r in rows:
            if r["impl"] == impl and r["dtype"] == dtype and "tokens_per_s" in r:
                return float(r["tokens_per_s"])
        return None

    ratios = {}
    for dtype in ("float32", "bfloat16"):
        ours = rate("linstream cupy (device arrays)", dtype)
        for rival in ("fla chunk_linear_attn", "pytorch chunked (same form, fp32 matmuls)"):
            theirs = rate(rival, dtype)
            if ours and theirs:
                ratios[f"linstream/{rival.split()[0]} {dtype}"] = ours / theirs
    report["ratios"] = ratios
    if ratios:
        print(
            "\n    throughput ratios (same run): "
            + ", ".join(f"{k} = {v:.2f}" for k, v in ratios.items())
        )


def _print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| implementation | inputs | ms | M tokens/s | M head-tokens/s | max token err |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        if "ms" in r:
            print(
                f"| {r['impl']} | {r['dtype']} | {r['ms']:.3f} | {r['tokens_per_s'] / 1e6:.2f} "
                f"| {r['head_tokens_per_s'] / 1e6:.1f} | {r['err_max']:.1e} |"
            )
        else:
            print(f"| {r['impl']} | {r['dtype']} | failed: {r['error']} | | | |")


def setup(report: dict[str, Any]) -> Any:
    """The device's `cupy` (NumPy in the dry run) with its name and versions in report, or None
    (report marked skipped) without a usable CUDA device."""
    global H, T
    _import_linstream()
    if DRY_RUN:
        H, T = 4, 2048
    from linstream.ops.backend import cupy_unavailable_reason

    report["shape"] = {"H": H, "d": D, "T": T, "chunk_size": CHUNK}
    reason = cupy_unavailable_reason()
    if reason is not None and not DRY_RUN:
        print(f"gpu_check: no usable CUDA device ({reason}); nothing to check on this machine.")
        report.update(status="skipped", reason=reason)
        return None
    cp = _cupy()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    report["device"] = name
    report.setdefault("versions", {}).update(cupy=cp.__version__, numpy=np.__version__)
    try:
        import torch

        report["versions"]["torch"] = torch.__version__
    except ImportError:
        pass
    print(f"gpu_check on {name}: {report['versions']}")
    if DRY_RUN:
        report["dry_run"] = True
        print("gpu_check: DRY RUN on the CPU (NumPy stands in for CuPy, the rule kernels run on "
              "the CPU emulator): timings mean nothing")  # fmt: skip
    return cp


def correctness(report: dict[str, Any], seed: int) -> bool:
    """Sections 1, 1b, 1c into report; False when a case failed (each failure printed with its
    rule or backend, kernel and worst error)."""
    import gpu_check_rules as rules
    import gpu_check_ssd_dplr as ssd_dplr

    print(f"\n[1] correctness vs float64 oracle, random chunk splits (GPU_CHECK_SEED={seed})")
    rows = check_random_splits(4 if DRY_RUN else 12, seed)
    report["correctness"] = {"seed": seed, "cases": rows}
    ok = all(r["ok"] for r in rows)
    for r in rows:
        if not r["ok"]:
            worst = max(r["err_max"], r["state_err"])
            print(f"gpu_check: FAILED additive (cupy_causal, {r['dtype']}, case seed "
                  f"{r['seed']}): worst error {worst:.3g} (tolerance {r['tol']})")  # fmt: skip
    print("\n[1b] update rules' kernels: float64 references, bfloat16, the Numba kernels")
    rule_rows = rules.correctness(seed, 1 if DRY_RUN else 3, DRY_RUN, NUMBA_REFS)
    report["rules_correctness"] = {"seed": seed, "cases": rule_rows}
    ok = ok and all(r["ok"] for r in rule_rows)
    print("\n[1c] Mamba-2's SSD and RWKV-7's DPLR kernels: references, bfloat16, the Numba kernels")
    sd_rows = ssd_dplr.correctness(seed, 1 if DRY_RUN else 2, DRY_RUN, SSD_DPLR_REFS)
    report["ssd_dplr_correctness"] = {"seed": seed, "cases": sd_rows}
    ok = ok and all(r["ok"] for r in sd_rows)
    for r in sd_rows:
        if not r["ok"]:
            print(f"gpu_check: FAILED {r['rule']} ({r['kernel']}, {r.get('what', r.get('check'))}):"
                  f" worst error {r.get('err')} (tolerance {r.get('tol')})")  # fmt: skip
    for r in rule_rows:
        if not r["ok"]:
            print(f"gpu_check: FAILED {r['rule']} ({r['kernel']}, {r['check']}): worst error "
                  f"{r['err']}")  # fmt: skip
    return ok


def speed(report: dict[str, Any], cp: Any, optional_s: float, rules_s: float) -> bool:
    """Sections 2-4 (throughput) into report: the additive part's optional sections stop past
    `optional_s`, the SSD/DPLR and rules' rows past `rules_s` (seconds since T0).  False when a
    linstream row's error exceeds its bound."""
    global BUDGET_S
    import gpu_check_rules as rules
    import gpu_check_ssd_dplr as ssd_dplr

    BUDGET_S = optional_s
    ok = True
    try:
        throughput(report)
    except Exception as ex:
        import traceback

        traceback.print_exc()
        report["throughput_error"] = f"{type(ex).__name__}: {ex}"
    rows_t = report.get("throughput", [])
    for r in rows_t:
        if r.get("impl", "").startswith("linstream") and "err_max" in r and r["err_max"] > 2e-5:
            ok = False
            print(f"gpu_check: FAILED {r['impl']} (cupy_causal, {r['dtype']}): worst error "
                  f"{r['err_max']:.2e} > 2e-5")  # fmt: skip
    try:
        sd_t = ssd_dplr.throughput(
            DRY_RUN, T0 + rules_s, timed, lambda: cp.cuda.Device().synchronize()
        )
        sd_t["ratios"] = ssd_dplr.ratios(sd_t)
        report["ssd_dplr_throughput"] = sd_t
    except Exception as ex:
        import traceback

        traceback.print_exc()
        report["ssd_dplr_throughput_error"] = f"{type(ex).__name__}: {ex}"
    try:
        report["rules_throughput"] = rules.throughput(
            DRY_RUN, T0 + rules_s, timed, lambda: cp.cuda.Device().synchronize()
        )
    except Exception as ex:
        import traceback

        traceback.print_exc()
        report["rules_throughput_error"] = f"{type(ex).__name__}: {ex}"
    _print_table(rows_t)
    rules.print_table(report.get("rules_throughput", {}))
    rules.print_table(report.get("ssd_dplr_throughput", {}))
    if report.get("ssd_dplr_throughput", {}).get("ratios"):
        print(f"linstream / fla tokens/s (bfloat16): {report['ssd_dplr_throughput']['ratios']}")
    return ok


def seed_from_env() -> int:
    """GPU_CHECK_SEED, or a fresh seed (printed by the sections that use it)."""
    return int(os.environ.get("GPU_CHECK_SEED", "0")) or int(
        np.random.SeedSequence().entropy % 2**32
    )


def main(argv: list[str]) -> int:
    _import_linstream()
    import gpu_check_rules as rules
    import gpu_check_ssd_dplr as ssd_dplr

    if argv[:1] == ["--prepare-numba"] and len(argv) == 2:
        rules.prepare_numba(argv[1], dry_run=DRY_RUN)
        ssd_dplr.prepare(str(Path(argv[1]).with_name("ssd_dplr_refs.npz")), dry_run=DRY_RUN)
        return 0
    report: dict[str, Any] = {}
    cp = setup(report)
    if cp is None:
        _write_json(report)
        return 0
    ok = correctness(report, seed_from_env())
    ok = speed(report, cp, BUDGET_S, RULES_DEADLINE_S) and ok
    report["status"] = "ok" if ok else "failed"
    report["wall_s"] = _elapsed()
    _write_json(report)
    print(f"\ngpu_check: {report['status']} in {_elapsed():.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
