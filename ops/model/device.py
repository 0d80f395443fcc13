"""Where the model's forward runs on a device: the device interface, the CuPy device, state
transfers, and attention on device arrays with eps in the unscaled domain (FAVOR+).

`_CupyDevice.attend` is `exact_eps_attend` over `cupy_causal`: for a map whose query form
rescales each token (FAVOR+, see ops/rules/exact_eps.py), the kernel runs on pre-mapped features
with eps = 0 and eps is applied per token afterwards, y = r · den / (den + eps · exp(-s_t - b)),
as the host path does; a float32 chunk in which a key's largest feature would leave float32's
normal range runs in float64 (one flag read back from the device).  The CPU tests run the same
function over NumPy stand-in devices, and `_CupyDevice` itself with the CUDA kernels on the CPU
emulator (tests/ops/model/test_model_device.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
from linstream.ops.attention_state import AttentionState
from linstream.ops.cuda import Launcher
from linstream.ops.feature_maps import FeatureMap, Identity

__all__ = ["exact_eps_attend", "move_arrays"]

# smallest largest-feature of a key that float32 holds to full precision (normal range · 2^24),
# as ops/rules/exact_eps.py
_F32_LOW = float(np.finfo(np.float32).tiny) * 2.0**24
_BLOCK = 1024  # tokens per block of the running key sums

Causal = Callable[..., tuple[Any, AttentionState]]


def exact_eps_attend(
    q: Any,
    k: Any,
    v: Any,
    state: AttentionState,
    *,
    feature_map: FeatureMap,
    eps: float,
    causal: Causal,
    xp: Any,
    to_host: Callable[[Any], np.ndarray],
) -> tuple[Any, AttentionState]:
    """causal(q, k, v, state, feature_map=, eps=, dtype=) on arrays of xp, giving the textbook
    y = φ(q)ᵀS / (φ(q)ᵀz + eps) for every map (see the module docstring)."""
    from linstream.ops.rules.exact_eps import needs_exact_eps  # ops.rules imports Numba

    fm = feature_map
    dk = int(q.shape[2])
    if not needs_exact_eps(fm, dk):
        return causal(q, k, v, state, feature_map=fm, eps=eps, dtype=q.dtype)
    qf, shift = fm.query_and_shift(q, xp=xp)
    kf = fm(k, xp=xp)
    f32 = np.dtype(q.dtype) == np.float32 and int(kf.size) > 0
    if f32 and not bool(to_host(xp.all(kf.max(axis=-1) >= _F32_LOW))):
        q64, k64 = q.astype(np.float64), k.astype(np.float64)
        qf, shift = fm.query_and_shift(q64, xp=xp)
        kf = fm(k64, xp=xp)
    log_f = xp.full(tuple(q.shape[:2]), -fm.key_shift(dk), dtype=np.float64)  # [T, H]
    if shift is not None:
        log_f = log_f - shift[..., 0].astype(np.float64)
    out, new = causal(qf, kf, v, state, feature_map=Identity(), eps=0.0, dtype=qf.dtype)
    y = _restore_eps(out, qf, kf, state.z, float(eps), log_f, xp)
    return y.astype(q.dtype, copy=False), new


def _restore_eps(r: Any, qf: Any, kf: Any, z0: Any, eps: float, log_f: Any, xp: Any) -> Any:
    """y = r · den / (den + eps_t) from r = num/den (eps = 0), den formed in float64; y = 0
    where den = 0 (every feature product is 0 there, and r is NaN)."""
    t, h = int(r.shape[0]), int(r.shape[1])
    with np.errstate(over="ignore"):
        eps_t = eps * xp.exp(log_f) if eps != 0 else xp.zeros((t, h), dtype=np.float64)
    den = xp.empty((t, h), dtype=np.float64)
    run = z0.astype(np.float64)  # [H, F]
    for s in range(0, t, _BLOCK):
        e = min(s + _BLOCK, t)
        zc = run[None] + xp.cumsum(kf[s:e], axis=0, dtype=np.float64)
        den[s:e] = xp.einsum("thf,thf->th", qf[s:e].astype(np.float64), zc)
        run = zc[-1]
    zero = den == 0
    safe = xp.where(zero, 1.0, den)
    keep = safe / (safe + eps_t)
    return xp.where(zero[..., None], 0.0, r.astype(np.float64) * keep[..., None])


class _Device:
    """How the forward runs on a device: its array namespace, copies both ways, and attention
    on its arrays.  `_CupyDevice` is the real one; the CPU tests substitute NumPy stand-ins to
    run the same path (`EmbeddingModel._embed_chunk_on`)."""

    xp: Any

    def cache_key(self) -> Hashable:
        """Which device: weights are uploaded once per model and key."""
        raise NotImplementedError

    def is_device(self, a: Any) -> bool:
        raise NotImplementedError

    def to_device(self, a: np.ndarray) -> Any:
        raise NotImplementedError

    def to_host(self, a: Any) -> np.ndarray:
        raise NotImplementedError

    def attend(
        self, q: Any, k: Any, v: Any, state: AttentionState, *, feature_map: Any, eps: float
    ) -> tuple[Any, AttentionState]:
        raise NotImplementedError


class _CupyDevice(_Device):
    """The CUDA device through CuPy: cuBLAS products, `cupy_causal` on device arrays.  Given a
    launcher (tests: the CPU emulator of tests/helpers/cuda_emu.py), the same path with that
    launcher's arrays and kernels."""

    def __init__(self, launcher: Launcher | None = None) -> None:
        from linstream.ops.additive.cupy import cupy_causal
        from linstream.ops.cuda import cupy_launcher

        self.launcher = launcher if launcher is not None else cupy_launcher()
        self.xp = self.launcher.xp
        self._default = launcher is None
        self._causal = functools.partial(cupy_causal, launcher=launcher)

    def cache_key(self) -> Hashable:
        if self._default:
            return ("cupy", int(self.xp.cuda.Device().id))
        return ("launcher", id(self.launcher))

    def is_device(self, a: Any) -> bool:
        return isinstance(a, self.xp.ndarray)

    def to_device(self, a: np.ndarray) -> Any:
        return self.xp.asarray(a)

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(self.launcher.to_host(a))

    def attend(
        self, q: Any, k: Any, v: Any, state: AttentionState, *, feature_map: Any, eps: float
    ) -> tuple[Any, AttentionState]:
        # CuPy q and state in -> CuPy out and state: nothing leaves the device (FAVOR+'s
        # float32 underflow check reads one flag back).  Not yet run on a GPU: the CPU tests
        # run it with the CUDA kernels on the emulator (tests/ops/model/test_model_device.py).
        return exact_eps_attend(
            q, k, v, state, feature_map=feature_map, eps=eps, causal=self._causal, xp=self.xp,
            to_host=self.to_host,
        )  # fmt: skip


@functools.cache
def _cupy_device() -> _CupyDevice:
    return _CupyDevice()


def _on_cupy(a: Any) -> bool:
    """A CuPy array (checked by its type's module: CuPy need not be importable)."""
    return type(a).__module__.split(".")[0] == "cupy"


def _states_on_device(states: Sequence[AttentionState], dev: _Device) -> bool:
    """True when every state array is on dev, False when none is; TypeError for a mix."""
    flags = [dev.is_device(a) for st in states for a in (st.S, st.z)]
    if all(flags):
        return True
    if not any(flags):
        return False
    i = flags.index(not flags[0]) // 2
    msg = (
        f"states mix host and device arrays (states[0] and states[{i}] differ): pass all on "
        "the host (NumPy) or all on the device (to_host_states / to_device_states convert)"
    )
    raise TypeError(msg)


def move_arrays(arrays: Sequence[Any], src: Any, move: Callable[[Any], Any]) -> list[Any]:
    """Copy arrays (of namespace src) across with `move`: in one packed transfer when they share
    a dtype (the results are views of the one moved buffer), else one transfer per array."""
    if len({np.dtype(a.dtype) for a in arrays}) != 1:
        return [move(a) for a in arrays]
    flat = move(src.concatenate([a.reshape(-1) for a in arrays]))
    out, pos = [], 0
    for a in arrays:
        n = int(a.size)
        out.append(flat[pos : pos + n].reshape(a.shape))
        pos += n
    return out


def _move_states(
    states: Sequence[AttentionState], src: Any, move: Callable[[Any], Any]
) -> list[AttentionState]:
    """Copy states (arrays of namespace src) across in one packed transfer (`move_arrays`)."""
    moved = move_arrays([a for st in states for a in (st.S, st.z)], src, move)
    return [AttentionState(moved[2 * i], moved[2 * i + 1]) for i in range(len(states))]


def _upload_states(states: Sequence[AttentionState], dev: _Device) -> list[AttentionState]:
    return _move_states(states, np, dev.to_device)


def _download_states(states: Sequence[AttentionState], dev: _Device) -> list[AttentionState]:
    return _move_states(states, dev.xp, dev.to_host)
