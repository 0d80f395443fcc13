"""`make gpu-check`'s part for the recurrences of Mamba-2 and RWKV-7: the SSD scan's and the DPLR
rule's CUDA kernels (ops/ssd/cupy.py, ops/dplr/cupy.py), imported by gpu_check.py from this folder.

    correctness(...)   DPLR: random cases (shapes, splits into calls, chunk lengths, dtypes)
                       against the float64 reference, with the derived tolerance of
                       tests/helpers/dplr_cases.py.  SSD: fixed inputs with random splits and
                       chunk lengths against transformers' float64 scan, with the derived
                       tolerance of tests/helpers/ssd_cases.py (transformers is not on the device
                       machine: its scan's results for these inputs come from a file prepared on
                       a CPU machine, `prepare`, or live where it imports).  Both: two runs
                       giving the same bits, bfloat16 inputs giving exactly the float32 results
                       of their values, and fixed cases against the Numba kernels (live where
                       Numba imports, else from the prepared file)
    throughput(...)    tokens/s of each kernel (float32 and bfloat16 inputs) at Mamba-2 / RWKV-7
                       head shapes, and of fla's Triton `chunk_dplr_delta_rule` beside the DPLR
                       kernel with their agreement (fla has no SSD kernel)

Every failure prints one line naming the rule, the kernel and the worst error.  In the dry run
(GPU_CHECK_CPU_DRYRUN=1) the kernels run on the CPU emulator at small shapes.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from helpers import dplr_cases as dc
from helpers import ssd_cases as sc
from helpers.bf16 import bf16_round

__all__ = ["correctness", "prepare", "ratios", "throughput"]

INF = (0.0, float("inf"))
DTYPES = [("float32", "float64"), ("float32", "float32"), ("float64", "float64")]
# The SSD inputs whose reference is prepared (seed, T, G, heads per group, P, N) and the fixed
# splits of the Numba comparison (for both kernels, float32 math and a float64 state).
SSD_CASES = [
    {"seed": 300, "t": 600, "g": 1, "hpg": 4, "p": 64, "n": 128, "limit": INF},
    {"seed": 301, "t": 900, "g": 2, "hpg": 2, "p": 20, "n": 64, "limit": (0.05, 1.0)},
]
SSD_DRY = {"t": 90, "hpg": 2, "p": 8, "n": 16}
DPLR_NUMBA = {"seed": 310, "t": 700, "h": 2, "dk": 64, "dv": 64}
DPLR_DRY = {"t": 80, "dk": 8, "dv": 20}
NUMBA_BOUNDS = (0.4, 0.75)  # the fixed splits, as fractions of T
NUMBA_CHUNK = 64


def _launcher(dry_run: bool) -> Any:
    if not dry_run:
        return None  # the current device
    from helpers.cuda_emu import EmuLauncher

    return EmuLauncher(schedule=1)


def _can_import(*names: str) -> bool:
    try:
        for name in names:
            __import__(name)
    except ImportError:
        return False
    return True


def _transformers_here() -> bool:
    """Whether transformers' scan runs here (GPU_CHECK_NO_NUMBA=1: act as the device machine,
    which has neither Numba nor transformers, so that the prepared file is what is read)."""
    if os.environ.get("GPU_CHECK_NO_NUMBA", "") not in ("", "0"):
        return False
    return _can_import("torch", "transformers")


def _numba_here() -> bool:
    import gpu_check_rules

    return gpu_check_rules._numba_available()


def _line(ok: bool, rule: str, kernel: str, what: str, detail: str) -> None:
    mark = "ok  " if ok else "FAIL"
    print(f"  {mark} {rule:<6s} {kernel:<12s} {what:<40s} {detail}", flush=True)


def _ssd_kw(spec: dict[str, Any], dry_run: bool) -> dict[str, Any]:
    s = {**spec, **SSD_DRY} if dry_run else spec
    return sc.case(np.random.default_rng(s["seed"]), s["t"], s["g"], s["hpg"], s["p"], s["n"])


def _dplr_x(dry_run: bool) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    s = {**DPLR_NUMBA, **DPLR_DRY} if dry_run else DPLR_NUMBA
    rng = np.random.default_rng(s["seed"])
    x = tuple(
        np.asarray(y, np.float32).astype(np.float64)
        for y in dc.inputs(rng, s["t"], s["h"], s["dk"], s["dv"])
    )
    return x, rng.standard_normal((s["h"], s["dk"], s["dv"]))


def _fixed_bounds(t: int) -> list[int]:
    return [0, int(NUMBA_BOUNDS[0] * t), int(NUMBA_BOUNDS[1] * t), t]


def prepare(path: str, dry_run: bool = False) -> None:
    """transformers' scan on SSD_CASES (y64, s64, e32, e32s) and the Numba kernels' outputs on
    the fixed cases, into an .npz to carry to a device machine without transformers or Numba."""
    arrays: dict[str, np.ndarray] = {}
    for i, spec in enumerate(SSD_CASES):
        kw = _ssd_kw(spec, dry_run)
        scan = sc.scan_errors(kw, spec["limit"])
        y, s = sc.streamed(kw, spec["limit"], _fixed_bounds(len(kw["x"])), np.float32,
                           np.float64, NUMBA_CHUNK)  # fmt: skip
        arrays |= {f"ssd{i}.y64": scan["y64"], f"ssd{i}.s64": scan["s64"],
                   f"ssd{i}.e32": np.array([scan["e32"], scan["e32s"]]),
                   f"ssd{i}.numba_y": y, f"ssd{i}.numba_s": s,
                   f"ssd{i}.shape": np.array(kw["x"].shape)}  # fmt: skip
    x, s0 = _dplr_x(dry_run)
    out, s = dc.run(x, s0, _fixed_bounds(len(x[0])), NUMBA_CHUNK, np.float32, np.float64)
    arrays |= {"dplr.numba_out": out, "dplr.numba_s": s, "dplr.shape": np.array(x[0].shape)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez_compressed(path, **arrays)
    print(f"gpu_check: wrote transformers' SSD scan and the Numba SSD / DPLR outputs to {path}")


def _refs(path: str | None) -> Any:
    if path and os.path.exists(path):
        return np.load(path)
    return None


def correctness(seed: int, n_cases: int, dry_run: bool, refs_path: str | None) -> list[dict]:
    from linstream.ops.dplr.cupy import dplr_chunks
    from linstream.ops.dplr.naive import dplr_recurrent
    from linstream.ops.ssd.cupy import ssd_chunks

    lau = _launcher(dry_run)
    refs = _refs(refs_path)
    rng = np.random.default_rng(seed + 35)
    rows: list[dict[str, Any]] = []

    def dplr(*a: Any, **k: Any) -> Any:
        return dplr_chunks(*a, **k, launcher=lau)

    def ssd(*a: Any, **k: Any) -> Any:
        return ssd_chunks(*a, **k, launcher=lau)

    def add(ok: bool, rule: str, kernel: str, what: str, detail: str, **row: Any) -> None:
        _line(ok, rule, kernel, what, detail)
        rows.append({"rule": rule, "kernel": kernel, "what": what, "ok": bool(ok), **row})

    # DPLR: random cases against the float64 reference
    for i in range(n_cases * len(DTYPES)):
        cdt, sdt = (np.dtype(d) for d in DTYPES[i % len(DTYPES)])
        cs = int(rng.integers(0, 2**32 - 1))
        r = np.random.default_rng(cs)
        t = int(r.integers(1, 120 if dry_run else 2000))
        h = int(r.integers(1, 3 if dry_run else 5))
        dk = int(r.choice([5, 16] if dry_run else [16, 64]))
        dv = int(r.choice([5, 20] if dry_run else [20, 64]))
        c = int(r.choice([16, 32, 64]))
        form = str(r.choice(["rwkv", "general"]))
        bounds = sorted({0, t, *r.integers(0, t + 1, size=int(r.integers(0, 4))).tolist()})
        x = tuple(np.asarray(y, cdt).astype(np.float64) for y in dc.inputs(r, t, h, dk, dv, form))
        s0 = np.asarray(r.standard_normal((h, dk, dv)), sdt)
        runs = [dc.run(x, s0, bounds, c, cdt, sdt, dplr) for _ in range(2)]
        same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*runs, strict=True))
        ref, s_ref = dplr_recurrent(*x, state=s0)
        tol = dc.tolerance(x, ref, s_ref, t, c, cdt, sdt)
        err = max(sc.worst(runs[0][0], ref), sc.worst(runs[0][1], s_ref))
        what = f"T={t} H={h} dk={dk} dv={dv} C={c} {form} {cdt.name[-2:]}/{sdt.name[-2:]}"
        detail = f"seed={cs} worst error {err:.2e} (tol {tol:.1e}){'' if same else '; runs differ'}"
        add(same and err <= tol, "dplr", "dplr_chunks", what, detail, seed=cs, err=err, tol=tol)
    # SSD: fixed inputs, random splits and chunk lengths, against transformers' float64 scan
    live = _transformers_here()
    for i, spec in enumerate(SSD_CASES):
        kw = _ssd_kw(spec, dry_run)
        if live:
            scan = sc.scan_errors(kw, spec["limit"])
        elif refs is not None and f"ssd{i}.y64" in refs:
            if refs[f"ssd{i}.shape"].tolist() != list(kw["x"].shape):
                add(False, "ssd", "ssd_chunks", f"case {i}", "the prepared file holds another case")
                continue
            e32, e32s = refs[f"ssd{i}.e32"].tolist()
            scan = {"y64": refs[f"ssd{i}.y64"], "s64": refs[f"ssd{i}.s64"], "e32": e32,
                    "e32s": e32s}  # fmt: skip
        else:
            print("  (no SSD reference: transformers does not import and no prepared file)")
            rows.append({"rule": "ssd", "ok": True, "skipped": "no reference"})
            break
        t = len(kw["x"])
        for cdt_name, sdt_name in DTYPES:
            cdt, sdt = np.dtype(cdt_name), np.dtype(sdt_name)
            cs = int(rng.integers(0, 2**32 - 1))
            r = np.random.default_rng(cs)
            c = int(r.choice([7, 16, 64]))
            bounds = sorted({0, t, *r.integers(0, t + 1, size=int(r.integers(0, 4))).tolist()})
            runs = [sc.streamed(kw, spec["limit"], bounds, cdt, sdt, c, ssd) for _ in range(2)]
            same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*runs, strict=True))
            tol, tol_s = sc.bounds_of(scan, cdt, sdt)
            err, err_s = sc.worst(runs[0][0], scan["y64"]), sc.worst(runs[0][1], scan["s64"])
            ok = same and err <= tol and err_s <= tol_s
            what = f"case {i} T={t} C={c} {cdt.name[-2:]}/{sdt.name[-2:]} {len(bounds) - 1} calls"
            detail = (f"seed={cs} y error {err:.2e} (tol {tol:.1e}), state {err_s:.2e} "
                      f"(tol {tol_s:.1e}){'' if same else '; runs differ'}")  # fmt: skip
            add(ok, "ssd", "ssd_chunks", what, detail, seed=cs, err=[err, err_s],
                tol=[tol, tol_s])  # fmt: skip
    # bfloat16 inputs: exactly the float32 results of their values
    kw = _ssd_kw(SSD_CASES[0], True)
    for name in ("x", "b", "c"):
        kw[name] = bf16_round(kw[name])[1].astype(np.float64)
    bits = sc.streamed(kw, INF, [0, 40, len(kw["x"])], np.float32, np.float64, 16, ssd,
                       convert=lambda v: _bf16_bits(v))  # fmt: skip
    vals = sc.streamed(kw, INF, [0, 40, len(kw["x"])], np.float32, np.float64, 16, ssd)
    diff = max(sc.worst(a, b) for a, b in zip(bits, vals, strict=True))
    add(diff == 0.0, "ssd", "ssd_chunks", "bfloat16 = float32 of its values", f"diff {diff:.2e}")
    x, s0 = _dplr_x(True)
    x = tuple(bf16_round(y)[1].astype(np.float64) for y in x)
    b = [0, 30, len(x[0])]
    bits = dc.run(x, s0, b, 16, np.float32, np.float64, dplr, convert=_bf16_bits)
    vals = dc.run(x, s0, b, 16, np.float32, np.float64, dplr)
    diff = max(sc.worst(a, b) for a, b in zip(bits, vals, strict=True))
    add(diff == 0.0, "dplr", "dplr_chunks", "bfloat16 = float32 of its values", f"diff {diff:.2e}")
    rows += _against_numba(ssd, dplr, dry_run, refs, refs_path)
    return rows


def _bf16_bits(v: np.ndarray) -> Any:
    from linstream.ops.cuda import Bfloat16Bits

    return Bfloat16Bits(bf16_round(v)[0])


def _against_numba(ssd: Any, dplr: Any, dry_run: bool, refs: Any, path: str | None) -> list:
    """The fixed cases against the Numba kernels (float32 math, float64 state): both within the
    derived tolerance of the reference, so within twice it of each other."""
    from linstream.ops.dplr.naive import dplr_recurrent

    live = _numba_here()
    if not live and refs is None:
        print("  (no Numba comparison for SSD / DPLR: Numba does not import here and there is no "
              f"prepared file at {path})")  # fmt: skip
        return [{"check": "numba", "ok": True, "skipped": "numba unavailable, no prepared file"}]
    source = "Numba here" if live else f"Numba's outputs from {path}"
    rows = []
    for i, spec in enumerate(SSD_CASES):
        kw = _ssd_kw(spec, dry_run)
        bounds = _fixed_bounds(len(kw["x"]))
        got = sc.streamed(kw, spec["limit"], bounds, np.float32, np.float64, NUMBA_CHUNK, ssd)
        if live:
            want = sc.streamed(kw, spec["limit"], bounds, np.float32, np.float64, NUMBA_CHUNK)
            scan = sc.scan_errors(kw, spec["limit"]) if _transformers_here() else None
        else:
            want = (refs[f"ssd{i}.numba_y"], refs[f"ssd{i}.numba_s"])
            e32, e32s = refs[f"ssd{i}.e32"].tolist()
            scan = {"e32": e32, "e32s": e32s}
        if scan is None:
            continue
        tol = [2 * v for v in sc.bounds_of(scan, np.float32, np.float64)]
        err = [sc.worst(g, w) for g, w in zip(got, want, strict=True)]
        ok = all(e <= v for e, v in zip(err, tol, strict=True))
        _line(ok, "ssd", "ssd_chunks", f"case {i} against {source}",
              f"y {err[0]:.2e} S {err[1]:.2e} (tol {tol[0]:.1e}, {tol[1]:.1e})")  # fmt: skip
        rows.append({"check": "numba", "rule": "ssd", "kernel": "ssd_chunks", "err": err,
                     "tol": tol, "ok": bool(ok)})  # fmt: skip
    x, s0 = _dplr_x(dry_run)
    bounds = _fixed_bounds(len(x[0]))
    got = dc.run(x, s0, bounds, NUMBA_CHUNK, np.float32, np.float64, dplr)
    if live:
        want = dc.run(x, s0, bounds, NUMBA_CHUNK, np.float32, np.float64)
    else:
        want = (refs["dplr.numba_out"], refs["dplr.numba_s"])
    ref, s_ref = dplr_recurrent(*x, state=s0)
    tol = 2 * dc.tolerance(x, ref, s_ref, len(x[0]), NUMBA_CHUNK, np.float32, np.float64)
    err = [sc.worst(g, w) for g, w in zip(got, want, strict=True)]
    ok = all(e <= tol for e in err)
    _line(ok, "dplr", "dplr_chunks", f"against {source}",
          f"out {err[0]:.2e} S {err[1]:.2e} (tol {tol:.1e})")  # fmt: skip
    rows.append({"check": "numba", "rule": "dplr", "kernel": "dplr_chunks", "err": err,
                 "tol": tol, "ok": bool(ok)})  # fmt: skip
    return rows


# ---- throughput --------------------------------------------------------------------------


def throughput(dry_run: bool, deadline: float, timed: Any, sync: Any) -> dict[str, Any]:
    """Rows of tokens/s (one call of T tokens, state in and out on the device): the SSD kernel
    at Mamba-2 130M's head shape (H=24, P=64, N=128, one group), the DPLR kernel at RWKV-7's
    (H=16, d_k = d_v = 64), float32 and bfloat16 inputs; fla's chunk_dplr_delta_rule beside it."""
    from linstream.ops.cuda import Bfloat16Bits, cupy_launcher
    from linstream.ops.dplr.cupy import dplr_chunks
    from linstream.ops.ssd.cupy import ssd_chunks

    t = 256 if dry_run else 16384
    lau = _launcher(dry_run)
    xp = (lau if lau is not None else cupy_launcher()).xp
    rows: list[dict[str, Any]] = []
    print(f"\n[3b] Mamba-2 SSD and RWKV-7 DPLR kernels, tokens/s: T={t}, one call")

    def dev(a: np.ndarray, form: str) -> Any:
        if form == "bfloat16":
            return Bfloat16Bits(xp.asarray(bf16_round(a)[0]))
        return xp.asarray(np.asarray(a, np.float32))

    import gpu_check_rules as gr

    sh = (2, 8, 16) if dry_run else (24, 64, 128)
    kw = sc.case(np.random.default_rng(7), t, 1, sh[0], sh[1], sh[2])
    ours: dict[str, Any] = {}
    for form in ("float32", "bfloat16"):
        if time.perf_counter() > deadline:
            break
        x, b, c = (dev(kw[n], form) for n in ("x", "b", "c"))
        dt = xp.asarray(kw["dt"])
        state = xp.zeros((sh[0], sh[1], sh[2]), dtype=np.float64)

        def run_ssd(x: Any = x, b: Any = b, c: Any = c, dt: Any = dt, state: Any = state) -> Any:
            return ssd_chunks(x, dt, kw["a"], b, c, kw["d"], state, dt_bias=kw["dt_bias"],
                              launcher=lau)  # fmt: skip

        gr._row(rows, "linstream ssd_chunks", "ssd", form, run_ssd, t, timed, sync)
    h, dk = (2, 8) if dry_run else (16, 64)
    x, s0 = dc.inputs(np.random.default_rng(8), t, h, dk, dk), np.zeros((h, dk, dk))
    for form in ("float32", "bfloat16"):
        if time.perf_counter() > deadline:
            break
        args = tuple(dev(y, form) for y in x)
        state = xp.asarray(s0)

        def run_dplr(args: tuple = args, state: Any = state) -> Any:
            return dplr_chunks(*args, state, chunk_size=32, launcher=lau)

        ours[form] = gr._row(rows, "linstream dplr_chunks", "dplr", form, run_dplr, t, timed, sync)
    if not dry_run and time.perf_counter() < deadline and _can_import("torch", "fla.ops"):
        _fla_dplr(rows, x, s0, ours.get("bfloat16"), xp, timed, sync, t)
    return {"T": t, "ssd_shape": sh, "dplr_shape": (h, dk), "rows": rows}


def _fla_dplr(rows: list, x: tuple, s0: np.ndarray, ours: Any, xp: Any, timed: Any, sync: Any,
              t: int) -> None:  # fmt: skip
    """fla's Triton chunk_dplr_delta_rule on the same (bfloat16) inputs, scale 1, [1, T, H, D]."""
    import torch
    from fla.ops import chunk_dplr_delta_rule

    try:
        q, k, v, a, b, gk = (
            torch.from_numpy(np.ascontiguousarray(bf16_round(y)[1])[None]).cuda().to(torch.bfloat16)
            for y in x
        )
        h0 = torch.from_numpy(s0[None]).cuda().float()

        def run() -> Any:
            return chunk_dplr_delta_rule(q, k, v, a, b, gk, scale=1.0, initial_state=h0,
                                         output_final_state=True)[0][0]  # fmt: skip

        import gpu_check_rules as gr

        got = gr._row(rows, "fla chunk_dplr_delta_rule", "dplr", "bfloat16", run, t, timed, sync)
        if got is not None and ours is not None:
            theirs = got.float().cpu().numpy().astype(np.float64)
            mine = np.asarray(xp.asnumpy(ours), np.float64)
            scale = max(float(np.max(np.abs(mine))), 1e-30)
            rows[-1]["agreement"] = float(np.max(np.abs(theirs - mine))) / scale
            print(f"    fla vs linstream dplr (bfloat16 inputs): largest difference "
                  f"{rows[-1]['agreement']:.1e} of the largest output")  # fmt: skip
    except Exception as ex:
        print(f"    fla chunk_dplr_delta_rule failed: {type(ex).__name__}: {ex}")
        rows.append({"impl": "fla chunk_dplr_delta_rule", "rule": "dplr", "dtype": "bfloat16",
                     "error": f"{type(ex).__name__}: {ex}"})  # fmt: skip


def ratios(report: dict[str, Any]) -> dict[str, float]:
    """linstream / fla tokens/s for the DPLR rule (bfloat16), where both rows ran."""
    rate = {r["impl"]: r["tokens_per_s"] for r in report.get("rows", [])
            if r.get("dtype") == "bfloat16" and "tokens_per_s" in r}  # fmt: skip
    ours, theirs = rate.get("linstream dplr_chunks"), rate.get("fla chunk_dplr_delta_rule")
    return {"dplr": ours / theirs} if ours and theirs else {}
