"""Cases for the update rules' chunk kernels, run the same way on each implementation: random
inputs, the float64 token-by-token reference, and a run over a split into calls with the state
carried (tests/ops/rules/test_rules_cupy_emu.py, tests/ops/rules/test_rules_cupy_gpu.py,
tests/gpu/gpu_check.py).

    case = make_case("gated_delta", seed=3, t=200, h=2, dk=16, dv=20)
    ref = reference(case)                                   # (out [T, H, d_v], S, z) float64
    got = run_split(case, [0, 70, 200], impl="cupy", c=64, launcher=EmuLauncher())
    assert error(got, ref) <= tolerance(case, ref, c=64, n_calls=2)

Each kernel is called as its rule's dispatch calls it (ops/rules/dispatch.py): head-major
inputs with the feature map applied (keys L2-normalized for the delta rules, a ones column on V
for the decaying ones), the state updated in place.  "vector" is the vector-gated rule (no map,
no normalizer).  Tolerance (derived as in tests/ops/rules/test_rules_splits.py): an output is a
sum of at most n = F + C + (kernel chunks) products, each rounding by the compute dtype's unit
roundoff u_c relative to the magnitude M of its terms, plus the state's u_s for the carried sums,
so |Δ| ≤ 4·n·(u_c + u_s)·M with M = max(|y_ref|, |S_ref|, |v|); z is a sum over all tokens, so
its bound is T times that.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.cuda import Bfloat16Bits
from linstream.ops.decay.naive import gated_recurrent
from linstream.ops.decay.vector_naive import vector_gated_recurrent
from linstream.ops.delta.naive import gated_delta_recurrent, unit_keys
from linstream.ops.feature_maps import FeatureMap, get_feature_map

from helpers.bf16 import bf16_round

__all__ = ["KERNEL_OF", "RULES", "Case", "call_kernel", "check_emulated", "error", "heads",
           "initial_state", "kernel_inputs", "make_case", "reference", "run_split",
           "tolerance"]  # fmt: skip

# rule -> the kernel it runs ("decay" and "gated" share one, so do the delta rules)
KERNEL_OF = {
    "decay": "decay_chunks",
    "gated": "decay_chunks",
    "gated-unnormalized": "decay_chunks",
    "vector": "vector_gated_chunks",
    "delta": "delta_chunks",
    "gated_delta": "delta_chunks",
}
RULES = tuple(KERNEL_OF)
EPS = 1e-6


@dataclasses.dataclass
class Case:
    rule: str
    q: np.ndarray  # [T, H, d_k] float64
    k: np.ndarray
    v: np.ndarray  # [T, H, d_v]
    log_alpha: np.ndarray  # [T, H] (log γ for decay, 0 for delta); [T, H, d_k] for vector
    beta: np.ndarray  # [T, H] (ones where unused)
    s0: np.ndarray  # [H, F, d_v]
    z0: np.ndarray  # [H, F]
    fmap: str = "elu+1"

    @property
    def normalize(self) -> bool:
        return self.rule in ("decay", "gated")

    @property
    def family(self) -> str:
        return KERNEL_OF[self.rule]


def make_case(rule: str, seed: int, t: int, h: int, dk: int, dv: int, fmap: str = "elu+1") -> Case:
    """Random inputs with gates over a wide range (α from ~0.4 to 1) and β in (0, 1]; a
    nonzero starting state (as after a plausible prefix).  Every value is a float32 (held in
    float64), so that a float32 run and the reference see the same numbers."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((t, h, d)) for d in (dk, dk, dv))
    if rule == "decay":
        log_alpha = np.broadcast_to(np.log(rng.uniform(0.5, 0.999, size=h)), (t, h)).copy()
    elif rule in ("gated", "gated-unnormalized", "gated_delta"):
        log_alpha = -rng.exponential(0.2, size=(t, h))
    elif rule == "vector":
        log_alpha = -rng.exponential(0.2, size=(t, h, dk))
    else:
        log_alpha = np.zeros((t, h))
    beta = np.minimum(rng.uniform(0.0, 1.0, size=(t, h)) ** 0.5 + 1e-3, 1.0)
    f = dk if rule == "vector" else get_feature_map(fmap).out_dim(dk)
    n0 = int(rng.integers(0, 20))
    s0 = rng.uniform(-0.5, 0.5, (h, f, dv)) * n0
    z0 = (
        rng.uniform(0.5, 1.0, (h, f)) * n0
        if KERNEL_OF[rule] == "decay_chunks"
        else np.zeros((h, f))
    )
    q, k, v, log_alpha, beta = (np.asarray(x, np.float32).astype(np.float64)
                                for x in (q, k, v, log_alpha, beta))  # fmt: skip
    return Case(rule, q, k, v, log_alpha, beta, s0, z0, fmap)


def reference(case: Case) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out [T, H, d_v], S, z) of the float64 token-by-token reference."""
    st = AttentionState(case.s0, case.z0)
    if case.family == "decay_chunks":
        out, new = gated_recurrent(
            case.q, case.k, case.v, st, log_alpha=case.log_alpha, feature_map=case.fmap,
            eps=EPS, normalize=case.normalize,
        )  # fmt: skip
        return out, new.S, new.z
    if case.family == "delta_chunks":
        out, new = gated_delta_recurrent(
            case.q, case.k, case.v, st, log_alpha=case.log_alpha, beta=case.beta,
            feature_map=case.fmap,
        )  # fmt: skip
        return out, new.S, new.z
    out, s = vector_gated_recurrent(case.q, case.k, case.v, case.s0, log_gate=case.log_alpha)
    return out, s, case.z0.copy()


def _head_major(x: np.ndarray, cdt: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x).transpose(1, 0, 2), dtype=cdt)


def heads(
    x: np.ndarray, fm: FeatureMap | None, cdt: Any, *, unit: bool = False, ones: bool = False
) -> np.ndarray:
    """φ(x) [T, H, D] as [H, T, D (+1)] in cdt, as ops/rules/gather.py's `heads` makes it (in
    NumPy here: the helper runs where Numba is not installed, the device machine): φ applied
    in cdt, rows L2-normalized in float64 with `unit`, a ones column with `ones`."""
    y = np.asarray(x, dtype=cdt)
    if fm is not None:
        y = np.asarray(fm(y), dtype=cdt)
    if unit:
        y = unit_keys(y).astype(cdt)
    if ones:
        y = np.concatenate([y, np.ones((*y.shape[:2], 1), dtype=cdt)], axis=-1)
    return _head_major(y, cdt)


def kernel_inputs(case: Case, a: int, b: int, cdt: Any, form: str = "plain") -> dict[str, Any]:
    """The kernel's arguments for tokens a..b (the state excluded).  form: "plain" (cdt),
    "bf16-bits" (the head-major inputs rounded to bfloat16, as Bfloat16Bits), "bf16-values"
    (the same rounded values as float32)."""
    fm = get_feature_map(case.fmap)
    q, k, v = case.q[a:b], case.k[a:b], case.v[a:b]
    arrays: dict[str, Any]
    if case.family == "decay_chunks":
        arrays = {"qh": heads(q, fm, cdt), "kh": heads(k, fm, cdt)}
        arrays["vh"] = heads(v, None, cdt, ones=True)
    elif case.family == "delta_chunks":
        arrays = {"qh": heads(q, fm, cdt), "kh": heads(k, fm, cdt, unit=True)}
        arrays["vh"] = heads(v, None, cdt)
    else:
        arrays = {n: _head_major(x, cdt) for n, x in (("qh", q), ("kh", k), ("vh", v))}
        arrays["gh"] = _head_major(case.log_alpha[a:b], cdt)
    if form != "plain":
        for name, x in arrays.items():
            bits, values = bf16_round(x)
            arrays[name] = Bfloat16Bits(bits) if form == "bf16-bits" else values
    if case.family != "vector_gated_chunks":
        arrays["log_gate"] = np.ascontiguousarray(case.log_alpha[a:b].T)
    if case.family == "decay_chunks":
        arrays["eps_t"] = np.full((q.shape[1], b - a), EPS)
    if case.family == "delta_chunks":
        arrays["beta"] = np.ascontiguousarray(case.beta[a:b].T)
    return arrays


def _kernel(impl: str, family: str) -> Any:
    if impl == "numba":
        from linstream.ops.decay import numba as decay_numba
        from linstream.ops.decay import vector_numba
        from linstream.ops.delta import numba as delta_numba

        mods: dict[str, Any] = {"decay_chunks": decay_numba, "delta_chunks": delta_numba,
                                "vector_gated_chunks": vector_numba}  # fmt: skip
    else:
        from linstream.ops.decay import cupy as decay_cupy
        from linstream.ops.decay import vector_cupy
        from linstream.ops.delta import cupy as delta_cupy

        mods = {"decay_chunks": decay_cupy, "delta_chunks": delta_cupy,
                "vector_gated_chunks": vector_cupy}  # fmt: skip
    return getattr(mods[family], family)


def initial_state(case: Case, sdt: Any) -> np.ndarray:
    """The state array the kernel carries: S, with z as a last column for the decaying rules."""
    if case.family == "decay_chunks":
        return np.concatenate([case.s0, case.z0[..., None]], axis=-1).astype(sdt)
    return case.s0.astype(sdt)


def call_kernel(
    case: Case, x: dict[str, Any], state: Any, *, impl: str, c: int, launcher: Any = None
) -> Any:
    """One call of `impl`'s kernel ("numba", or "cupy" with `launcher`, None for the current
    device) on `kernel_inputs` x, updating `state` in place; returns out [H, T, d_v]."""
    fn = _kernel(impl, case.family)
    kw: dict[str, Any] = {"chunk_size": c}
    if impl == "cupy":
        kw["launcher"] = launcher
    if case.family == "decay_chunks":
        return fn(x["qh"], x["kh"], x["vh"], state, x["log_gate"], x["eps_t"],
                  normalize=case.normalize, **kw)  # fmt: skip
    if case.family == "delta_chunks":
        return fn(x["qh"], x["kh"], x["vh"], state, x["log_gate"], x["beta"], **kw)
    return fn(x["qh"], x["kh"], x["vh"], x["gh"], state, **kw)


def run_split(
    case: Case,
    bounds: list[int],
    *,
    impl: str,
    c: int,
    cdt: Any = np.float32,
    sdt: Any = np.float64,
    launcher: Any = None,
    form: str = "plain",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out [T, H, d_v] float64, S, z in sdt) of `impl` ("numba", or "cupy" with `launcher`, None
    for the current device) called once per piece of `bounds`, the state carried in place."""
    state = initial_state(case, sdt)
    outs = []
    for a, b in itertools.pairwise(bounds):
        if b == a:
            continue
        x = kernel_inputs(case, a, b, cdt, form)
        out = call_kernel(case, x, state, impl=impl, c=c, launcher=launcher)
        outs.append(np.asarray(out, dtype=np.float64).transpose(1, 0, 2))
    if case.family == "decay_chunks":
        return np.concatenate(outs), state[..., :-1], state[..., -1]
    return np.concatenate(outs), state, case.z0.astype(sdt)


def error(got: tuple[np.ndarray, ...], ref: tuple[np.ndarray, ...]) -> tuple[float, float, float]:
    """Largest absolute differences of (out, S, z)."""
    return tuple(float(np.max(np.abs(np.asarray(g, np.float64) - r), initial=0.0))
                 for g, r in zip(got, ref, strict=True))  # type: ignore[return-value]  # fmt: skip


def tolerance(
    case: Case, ref: tuple[np.ndarray, ...], *, c: int, n_calls: int, cdt: Any = np.float32,
    sdt: Any = np.float64,
) -> tuple[float, float, float]:  # fmt: skip
    """The derived bounds (see the module docstring) for (out, S, z)."""
    out, s, _z = ref
    t = case.q.shape[0]
    m = max(float(np.max(np.abs(out), initial=0)), float(np.max(np.abs(s), initial=0)),
            float(np.max(np.abs(case.v), initial=0)))  # fmt: skip
    n = s.shape[1] + c + -(-t // c) + n_calls
    u = float(np.finfo(cdt).eps) / 2 + float(np.finfo(sdt).eps) / 2
    tol = 4 * n * u * m
    return tol, tol, tol * max(1, t)


def check_emulated(
    case: Case, bounds: list[int], *, c: int, cdt: Any = np.float32, sdt: Any = np.float64,
    **launcher_kw: Any,
) -> None:  # fmt: skip
    """The CUDA kernel of `case` on the CPU emulator in forward and in reverse thread and block
    order: AssertionError unless both give the same bits (else the result depends on the order:
    a race) and match the reference within the derived tolerance.  launcher_kw: EmuLauncher's
    (max_shared, mutate)."""
    from helpers.cuda_emu import EmuLauncher

    runs = [
        run_split(case, bounds, impl="cupy", c=c, cdt=cdt, sdt=sdt,
                  launcher=EmuLauncher(schedule=s, **launcher_kw))
        for s in (0, 1)
    ]  # fmt: skip
    for what, a, b in zip(("out", "S", "z"), runs[0], runs[1], strict=True):
        if not np.array_equal(a, b, equal_nan=True):
            msg = f"{case.rule} {what}: forward and reverse thread order differ (a race)"
            raise AssertionError(msg)
    ref = reference(case)
    tol = tolerance(case, ref, c=c, n_calls=len(bounds) - 1, cdt=cdt, sdt=sdt)
    for what, e, t in zip(("out", "S", "z"), error(runs[0], ref), tol, strict=True):
        if not e <= t:  # NaN fails too
            raise AssertionError(f"{case.rule} {what}: error {e:.3g} > tolerance {t:.3g}")
