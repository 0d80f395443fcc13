"""`make gpu-check`'s part for the update rules' CUDA kernels (ops/decay/cupy.py, vector_cupy.py,
ops/delta/cupy.py), imported by gpu_check.py from this folder.

    correctness(...)   each rule's kernel over random splits against the float64 reference
                       (tolerance derived in tests/helpers/rule_kernels.py), two runs giving the
                       same bits, bfloat16 inputs giving exactly the float32 results of their
                       values, and fixed cases against the Numba kernel: live where Numba
                       imports, else from outputs prepared on a CPU machine (`prepare_numba`)
    throughput(...)    tokens/s of each kernel (float32 and bfloat16 inputs) and of fla's Triton
                       chunk kernel for the same rule where fla has one, with their agreement

Every failure prints one line naming the rule, the kernel and the worst error.  In the dry run
(GPU_CHECK_CPU_DRYRUN=1) the kernels run on the CPU emulator (tests/helpers/cuda_emu.py) at
small shapes, and fla's rows are absent (Triton needs a device).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from helpers import rule_kernels as rk

# The fixed cases compared with the Numba kernel (outputs prepared by `prepare_numba`).
NUMBA_CASES = [
    {"rule": r, "seed": 100 + i, "t": 1200, "h": 2, "dk": 64, "dv": 64, "bounds": [0, 500, 1200]}
    for i, r in enumerate(rk.RULES)
]
NUMBA_CHUNK = 64
# fla's chunk kernel for a rule: (function in fla.ops, how it reads the gates).  fla's kernels do
# not normalize: for "decay" (normalized here) the row compares speed only.
FLA_OF = {
    "decay": ("chunk_simple_gla", "g_gamma"),
    "gated-unnormalized": ("chunk_simple_gla", "g"),
    "vector": ("chunk_gla", "gk"),
    "delta": ("chunk_delta_rule", None),
    "gated_delta": ("chunk_gated_delta_rule", "g"),
}


def _launcher(dry_run: bool) -> Any:
    if not dry_run:
        return None  # the current device
    from helpers.cuda_emu import EmuLauncher

    return EmuLauncher(schedule=1)


def _numba_available() -> bool:
    """Whether the Numba kernels run here (GPU_CHECK_NO_NUMBA=1: act as on a machine without
    them, as the device machine is; the dry run's test of the prepared file uses it)."""
    if os.environ.get("GPU_CHECK_NO_NUMBA", "") not in ("", "0"):
        return False
    try:
        import numba  # noqa: F401
        import scipy  # noqa: F401  (Numba's np.dot)
    except ImportError:
        return False
    return True


def _case_line(ok: bool, rule: str, what: str, detail: str) -> None:
    mark = "ok  " if ok else "FAIL"
    print(f"  {mark} {rule:<18s} {rk.KERNEL_OF[rule]:<20s} {what:<34s} {detail}", flush=True)


def correctness(seed: int, n_cases: int, dry_run: bool, numba_refs: str | None) -> list[dict]:
    lau = _launcher(dry_run)
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    dtypes = [("float32", "float64"), ("float32", "float32"), ("float64", "float64")]
    for rule in rk.RULES:
        for i in range(n_cases):
            cs = int(rng.integers(0, 2**32 - 1))
            r = np.random.default_rng(cs)
            t = int(r.integers(1, 200 if dry_run else 2000))
            h = int(r.integers(1, 3 if dry_run else 5))
            dk = int(r.choice([1, 8, 16] if dry_run else [1, 16, 64, 128]))
            dv = int(r.choice([5, 20] if dry_run else [5, 20, 64, 128]))
            c = int(r.choice([7, 16, 64]))
            cdt, sdt = dtypes[i % len(dtypes)]
            bounds = sorted({0, t, *r.integers(0, t + 1, size=int(r.integers(0, 4))).tolist()})
            case = rk.make_case(rule, cs, t, h, dk, dv)
            kw = {"c": c, "cdt": np.dtype(cdt), "sdt": np.dtype(sdt), "launcher": lau}
            runs = [rk.run_split(case, bounds, impl="cupy", **kw) for _ in range(2)]
            same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*runs, strict=True))
            ref = rk.reference(case)
            tol = rk.tolerance(case, ref, c=c, n_calls=len(bounds) - 1, cdt=cdt, sdt=sdt)
            err = rk.error(runs[0], ref)
            ok = same and all(e <= x for e, x in zip(err, tol, strict=True))
            worst = max(range(3), key=lambda j: err[j] / max(tol[j], 1e-300))
            what = f"T={t} H={h} dk={dk} dv={dv} C={c} f{cdt[-2:]}/f{sdt[-2:]}"
            detail = (
                f"seed={cs} worst {('out', 'S', 'z')[worst]} error {err[worst]:.2e} "
                f"(tol {tol[worst]:.1e})" + ("" if same else "; two runs differ")
            )
            _case_line(ok, rule, what, detail)
            rows.append(
                {
                    "check": "reference",
                    "rule": rule,
                    "kernel": rk.KERNEL_OF[rule],
                    "seed": cs,
                    "T": t,
                    "H": h,
                    "dk": dk,
                    "dv": dv,
                    "C": c,
                    "dtype": cdt,
                    "state": sdt,
                    "bounds": bounds,
                    "err": err,
                    "tol": tol,
                    "deterministic": same,
                    "ok": bool(ok),
                }
            )
    for rule in ("gated", "vector", "gated_delta"):
        case = rk.make_case(
            rule,
            seed % 1000,
            150 if dry_run else 700,
            2,
            16 if dry_run else 64,
            20 if dry_run else 64,
        )
        b = [0, 60, case.q.shape[0]]
        bits = rk.run_split(case, b, impl="cupy", c=64, launcher=lau, form="bf16-bits")
        vals = rk.run_split(case, b, impl="cupy", c=64, launcher=lau, form="bf16-values")
        diff = max(
            float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(bits, vals, strict=True)
        )
        ok = diff == 0.0
        _case_line(ok, rule, "bfloat16 = float32 of its values", f"largest difference {diff:.2e}")
        rows.append(
            {"check": "bfloat16", "rule": rule, "kernel": rk.KERNEL_OF[rule], "err": diff, "ok": ok}
        )
    rows += _against_numba(lau, dry_run, numba_refs)
    return rows


def _numba_case(spec: dict[str, Any], dry_run: bool) -> tuple[rk.Case, list[int]]:
    if dry_run:
        spec = {**spec, "t": 120, "dk": 8, "dv": 20, "bounds": [0, 50, 120]}
    case = rk.make_case(spec["rule"], spec["seed"], spec["t"], spec["h"], spec["dk"], spec["dv"])
    return case, spec["bounds"]


def prepare_numba(path: str, dry_run: bool = False) -> None:
    """The Numba kernels' outputs for NUMBA_CASES (float32 math, float64 state), into an .npz to
    carry to a device machine without Numba."""
    arrays = {}
    for i, spec in enumerate(NUMBA_CASES):
        case, bounds = _numba_case(spec, dry_run)
        out, s, z = rk.run_split(case, bounds, impl="numba", c=NUMBA_CHUNK)
        arrays |= {
            f"{i}.out": out.astype(np.float32),
            f"{i}.S": s,
            f"{i}.z": z,
            f"{i}.case": np.array([case.q.shape[0], *case.s0.shape, spec["seed"]]),
        }
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez_compressed(path, **arrays)
    print(f"gpu_check: wrote the Numba kernels' outputs for {len(NUMBA_CASES)} cases to {path}")


def _against_numba(lau: Any, dry_run: bool, refs_path: str | None) -> list[dict]:
    refs = None
    if _numba_available():
        source = "Numba here"
    elif refs_path and os.path.exists(refs_path):
        refs, source = np.load(refs_path), f"Numba's outputs from {refs_path}"
    else:
        print(
            "  (no Numba comparison: Numba does not import here and GPU_CHECK_NUMBA_REFS names "
            "no prepared file; see gpu_check.py's docstring)"
        )
        return [{"check": "numba", "ok": True, "skipped": "numba unavailable, no prepared file"}]
    rows = []
    for i, spec in enumerate(NUMBA_CASES):
        case, bounds = _numba_case(spec, dry_run)
        got = rk.run_split(case, bounds, impl="cupy", c=NUMBA_CHUNK, launcher=lau)
        if refs is None:
            want = rk.run_split(case, bounds, impl="numba", c=NUMBA_CHUNK)
        else:
            shape = [case.q.shape[0], *case.s0.shape, spec["seed"]]
            if f"{i}.case" not in refs or refs[f"{i}.case"].tolist() != shape:
                _case_line(False, case.rule, f"against {source}", "prepared for another case")
                rows.append(
                    {
                        "check": "numba",
                        "rule": case.rule,
                        "kernel": case.family,
                        "err": "the file holds another case",
                        "ok": False,
                    }
                )
                continue
            want = (refs[f"{i}.out"].astype(np.float64), refs[f"{i}.S"], refs[f"{i}.z"])
        ref = rk.reference(case)
        # both within the derived tolerance of the reference, so within twice it of each other
        tol = [2 * x for x in rk.tolerance(case, ref, c=NUMBA_CHUNK, n_calls=len(bounds) - 1)]
        err = rk.error(got, want)
        ok = all(e <= x for e, x in zip(err, tol, strict=True))
        _case_line(
            ok,
            case.rule,
            f"against {source}",
            f"out {err[0]:.2e} S {err[1]:.2e} (tol {tol[0]:.1e})",
        )
        rows.append(
            {
                "check": "numba",
                "rule": case.rule,
                "kernel": case.family,
                "err": err,
                "tol": tol,
                "source": source,
                "ok": bool(ok),
            }
        )
    return rows


# ---- throughput --------------------------------------------------------------------------


def prune_fla_autotune() -> str:
    """Triton autotunes each fla kernel over up to 48 configurations, compiling each: minutes a
    rule on a fresh machine.  Keep the first 4 with num_warps = 4 (GPU_CHECK_FLA_FULL_AUTOTUNE=1
    keeps all); said in the report, since it may leave fla a little slower than its best."""
    if os.environ.get("GPU_CHECK_FLA_FULL_AUTOTUNE", "") not in ("", "0"):
        return "full autotune"
    from triton.runtime.autotuner import Autotuner

    original = Autotuner.prune_configs
    if getattr(original, "gpu_check_pruned", False):
        return _PRUNED

    def pruned(self: Any, kwargs: Any) -> Any:
        configs = original(self, kwargs)
        return ([c for c in configs if getattr(c, "num_warps", 4) == 4] or configs)[:4]

    pruned.gpu_check_pruned = True  # type: ignore[attr-defined]
    Autotuner.prune_configs = pruned  # type: ignore[method-assign]
    return _PRUNED


_PRUNED = "autotune pruned to 4 configs with num_warps = 4 (time budget)"


def fla_arguments(
    rule: str, x: dict[str, Any], s0: np.ndarray, torch: Any, dtype: Any, device: str = "cuda"
) -> tuple[str, tuple, dict[str, Any]]:
    """(name in fla.ops, args, kwargs) of fla's chunk kernel for `rule` on the kernel inputs x
    (head-major, as linstream's kernel gets them; [1, T, H, D] for fla), from state s0."""
    name, gate = FLA_OF[rule]

    def tensor(a: np.ndarray, dt: Any = dtype) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dt)

    def btd(a: np.ndarray) -> Any:  # [H, T, D] -> [1, T, H, D]
        return tensor(a.transpose(1, 0, 2)[None])

    v = x["vh"][..., :-1] if rk.KERNEL_OF[rule] == "decay_chunks" else x["vh"]
    h0 = tensor(s0[..., : v.shape[2]][None], torch.float32)  # [1, H, K, V]
    kw: dict[str, Any] = {"scale": 1.0, "initial_state": h0, "output_final_state": True}
    if gate == "g_gamma":
        kw["g_gamma"] = tensor(x["log_gate"][:, 0], torch.float32)  # [H]
    elif gate == "g":
        kw["g"] = tensor(x["log_gate"].T[None], torch.float32)  # [1, T, H]
    elif gate == "gk":
        kw["g"] = btd(x["gh"])  # [1, T, H, K]
    if rk.KERNEL_OF[rule] == "delta_chunks":
        kw["beta"] = tensor(x["beta"].T[None])  # [1, T, H]
    return name, (btd(x["qh"]), btd(x["kh"]), btd(v)), kw


def _fla_call(rule: str, x: dict[str, Any], s0: np.ndarray, torch: Any, dtype: Any) -> Any:
    """A closure running fla's chunk kernel for `rule`, returning its output [H, T, d_v]."""
    import fla.ops as fops

    name, args, kw = fla_arguments(rule, x, s0, torch, dtype)
    fn = getattr(fops, name)

    def run() -> Any:
        return fn(*args, **kw)[0][0].transpose(0, 1)

    return run


def throughput(dry_run: bool, deadline: float, timed: Any, sync: Any) -> dict[str, Any]:
    """Rows of tokens/s (H=16, d_k = d_v = 64, T = 16,384, one call, state in and out on the
    device) for each rule: linstream float32 and bfloat16 inputs, fla bfloat16."""
    from linstream.ops.cuda import cupy_launcher

    h, d, t = (2, 16, 256) if dry_run else (16, 64, 16384)
    lau = _launcher(dry_run)
    device = lau if lau is not None else cupy_launcher()
    xp = device.xp
    torch = fla_mode = None
    if not dry_run:
        try:
            import fla.ops  # noqa: F401
            import torch

            fla_mode = prune_fla_autotune()
        except Exception as ex:
            fla_mode = f"unavailable: {type(ex).__name__}: {ex}"
    print(f"\n[4] update rules, tokens/s: H={h} d_k=d_v={d} T={t}, one call; fla: {fla_mode}")
    rows: list[dict[str, Any]] = []
    for rule in rk.RULES:
        if time.perf_counter() > deadline:
            print(f"    skipped {rule}: time budget spent")
            continue
        case = rk.make_case(rule, 7, t, h, d, d)
        s0 = rk.initial_state(case, np.float64)
        ours = {}
        for form in ("plain", "bf16-bits"):
            x = rk.kernel_inputs(case, 0, t, np.float32, form)
            dev = {n: _to(xp, a) for n, a in x.items()}
            state = xp.asarray(s0)

            def run(dev: dict = dev, state: Any = state, case: rk.Case = case) -> Any:
                return rk.call_kernel(case, dev, state, impl="cupy", c=64, launcher=lau)

            dtype = "float32" if form == "plain" else "bfloat16"
            ours[dtype] = _row(
                rows, f"linstream {rk.KERNEL_OF[rule]}", rule, dtype, run, t, timed, sync
            )
        if torch is not None and rule in FLA_OF and time.perf_counter() < deadline:
            x = rk.kernel_inputs(case, 0, t, np.float32, "bf16-values")
            try:
                fla_run = _fla_call(rule, x, s0, torch, torch.bfloat16)
                got = _row(
                    rows, f"fla {FLA_OF[rule][0]}", rule, "bfloat16", fla_run, t, timed, sync
                )
                if got is not None and ours.get("bfloat16") is not None and not case.normalize:
                    a = np.asarray(got.float().cpu().numpy(), np.float64)
                    b = np.asarray(device.to_host(ours["bfloat16"]), np.float64)
                    scale = max(float(np.max(np.abs(b))), 1e-30)
                    rows[-1]["agreement"] = float(np.max(np.abs(a - b))) / scale
                    print(
                        f"    {'':<18s} fla vs linstream (bfloat16 inputs): largest difference "
                        f"{rows[-1]['agreement']:.1e} of the largest output"
                    )
            except Exception as ex:
                print(f"    fla {FLA_OF[rule][0]} ({rule}) failed: {type(ex).__name__}: {ex}")
                rows.append(
                    {
                        "impl": f"fla {FLA_OF[rule][0]}",
                        "rule": rule,
                        "dtype": "bfloat16",
                        "error": f"{type(ex).__name__}: {ex}",
                    }
                )
    ratios = {}
    for rule in FLA_OF:
        ours_r = [
            r
            for r in rows
            if r["rule"] == rule
            and r["impl"].startswith("linstream")
            and r["dtype"] == "bfloat16"
            and "tokens_per_s" in r
        ]
        fla_r = [
            r
            for r in rows
            if r["rule"] == rule and r["impl"].startswith("fla") and "tokens_per_s" in r
        ]
        if ours_r and fla_r:
            ratios[rule] = ours_r[0]["tokens_per_s"] / fla_r[0]["tokens_per_s"]
    if ratios:
        print(
            "    linstream / fla tokens/s (bfloat16): "
            + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
        )
    return {"shape": {"H": h, "d": d, "T": t}, "fla": fla_mode, "rows": rows, "ratios": ratios}


def _to(xp: Any, a: Any) -> Any:
    from linstream.ops.cuda import Bfloat16Bits

    if isinstance(a, Bfloat16Bits):
        return Bfloat16Bits(xp.asarray(a.bits))
    return xp.asarray(a)


def _row(
    rows: list, impl: str, rule: str, dtype: str, fn: Any, t: int, timed: Any, sync: Any
) -> Any:
    try:
        out = fn()
        sync()
        sec = timed(fn, sync, 10)
    except Exception as ex:
        print(f"    {impl} ({rule}, {dtype}) failed: {type(ex).__name__}: {ex}")
        rows.append(
            {"impl": impl, "rule": rule, "dtype": dtype, "error": f"{type(ex).__name__}: {ex}"}
        )
        return None
    rows.append(
        {"impl": impl, "rule": rule, "dtype": dtype, "ms": sec * 1e3, "tokens_per_s": t / sec}
    )
    rate = t / sec / 1e6
    print(
        f"    {rule:<18s} {impl:<36s} {dtype:<8s} {sec * 1e3:9.3f} ms  {rate:8.3f} M tok/s",
        flush=True,
    )
    return out


def print_table(report: dict[str, Any]) -> None:
    print("\n| rule | implementation | inputs | ms | M tokens/s |")
    print("|---|---|---|---:|---:|")
    for r in report.get("rows", []):
        if "ms" in r:
            print(
                f"| {r['rule']} | {r['impl']} | {r['dtype']} | {r['ms']:.3f} | "
                f"{r['tokens_per_s'] / 1e6:.3f} |"
            )
        else:
            print(f"| {r['rule']} | {r['impl']} | {r['dtype']} | failed: {r['error']} | |")
