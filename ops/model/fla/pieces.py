"""The layer pieces of fla's models, in NumPy, for one chunk of T tokens in the compute dtype.

    rms_norm(x, w, eps)                 x / sqrt(mean(x²) + eps) · w        (w None: no weight)
    add_rms_norm(x, a, w, eps)          (x + a, rms_norm(x + a, w, eps))    (a block's residual)
    layer_norm(x, w, b, eps)            (x − mean(x)) / sqrt(var(x) + eps) · w + b  (None: without)
    head_norm(o, w, eps, gate, act)     the same per head over d_v, times act(gate) if given
    swiglu(gate, up)                    silu(gate) · up
    short_conv(x, tail, w, silu)        depthwise causal conv of width W over the chunk, its first
                                        outputs reading the last W−1 raw inputs of the previous
                                        chunk (`tail`); returns (y, the new tail)
    l2_norm(x)                          x / sqrt(Σx² + 1e-6) over the last axis (fla's kernels'
                                        formula: the eps is inside the root)
    log_gate(z, b, n, clamp, d, rep)    max(logsigmoid(z + b) / n, clamp), head-major (GLA's gate)
    head_major(x, d, repeat)            [T, n·d] -> a new contiguous [n·repeat, T, d]
    l2_heads(x, d, scale)               l2_norm per head of x [T, H·d] · scale, head-major [H, T, d]
    sum_norm(x)                         x / max(Σ|x|, 1e-6)  (torch's F.normalize with p=1)
    rotary(x, cos, sin)                 rotary position embedding, halves not interleaved
    rotary_tables(dim, start, t, dt)    cos, sin [t, dim/2] for positions start..start+t−1
    silu, sigmoid, logsigmoid, softplus, elu_plus_one

Every function takes an optional array namespace `xp`: None (the host) runs NumPy and, on the
large arrays, the fused Numba passes; a module (NumPy, CuPy, the tests' emulated device) runs the
same expressions in that namespace, never a Numba pass (`compute`: the device backend passes its
launcher's xp).  Every function returns a new array (the inputs are never written).  sigmoid
uses the tanh form, logsigmoid the split min(x, 0) − log1p(e^−|x|), so nothing overflows for
any finite input; silu, swiglu and the RMS norms, on the large arrays, are fused Numba passes
(`fused`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = [
    "ACTIVATIONS",
    "add_rms_norm",
    "elu_plus_one",
    "head_major",
    "head_norm",
    "l2_heads",
    "l2_norm",
    "layer_norm",
    "log_gate",
    "logsigmoid",
    "rms_norm",
    "rotary",
    "rotary_heads",
    "rotary_tables",
    "short_conv",
    "sigmoid",
    "silu",
    "softplus",
    "sum_norm",
    "swiglu",
]

_L2_EPS = 1e-6  # fla.modules.l2norm's default, inside the square root
_SUM_EPS = 1e-6  # fla.layers.delta_net.sum_norm: F.normalize(x, p=1, eps=1e-6)
_SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus: x itself above it
ROTARY_BASE = 10000.0  # fla.modules.rotary.RotaryEmbedding's default (RetNet passes no other)


def _fused() -> Any:
    """The fused Numba passes, imported on the host's first call (a device needs no Numba)."""
    from . import fused

    return fused


def _fused_heads() -> Any:
    """The head-major passes (`fused_heads`), imported as `_fused`."""
    from . import fused_heads

    return fused_heads


def _ns(xp: Any) -> Any:
    return np if xp is None else xp


def sigmoid(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """1 / (1 + e^−x) as (1 + tanh(x/2)) / 2."""
    s = _ns(xp).tanh(x * 0.5)
    s += 1.0
    s *= 0.5
    return s


def silu(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """x · sigmoid(x) (fla's swish), one fused pass (`fused.silu`) on the host."""
    if xp is not None:
        return x * sigmoid(x, xp=xp)
    return _fused().silu(x.reshape(-1, x.shape[-1])).reshape(x.shape)


def logsigmoid(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """log(sigmoid(x)) = min(x, 0) − log1p(e^−|x|), always ≤ 0."""
    n = _ns(xp)
    return n.minimum(x, 0.0) - n.log1p(n.exp(-n.abs(x)))


def log_gate(
    z: np.ndarray,
    b: np.ndarray,
    normalizer: float,
    clamp: float | None,
    d: int,
    repeat: int = 1,
    *,
    xp: Any = None,
) -> np.ndarray:
    """max(logsigmoid(z + b) / normalizer, clamp) of z [T, K] (GLA's gate; clamp None: none),
    head-major [K/d · repeat, T, d] (`head_major`'s layout), in one fused pass
    (`fused.log_gate`) on the host."""
    if xp is None:
        return _fused().log_gate(z, b, normalizer, clamp, d, repeat)
    g = logsigmoid(z + b, xp=xp) / z.dtype.type(normalizer)
    if clamp is not None:
        g = xp.maximum(g, z.dtype.type(clamp))
    return head_major(g, d, repeat, xp=xp)


def head_major(x: np.ndarray, d: int, repeat: int = 1, *, xp: Any = None) -> np.ndarray:
    """[T, n·d] -> a new contiguous [n·repeat, T, d], each head repeated `repeat` times in place
    (head i of the result is head i // repeat of x: fla's grouped key/value heads)."""
    if xp is None and _fusable(x, 2):
        return _fused_heads().head_major(x, d, repeat)  # one pass on Numba's threads
    n = _ns(xp)
    t = x.shape[0]
    h = n.ascontiguousarray(x.reshape(t, -1, d).transpose(1, 0, 2))
    return n.repeat(h, repeat, axis=0) if repeat > 1 else h


def softplus(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """log(1 + e^x), and x itself above 20, as torch's F.softplus (beta 1, threshold 20)."""
    n = _ns(xp)
    with np.errstate(over="ignore"):
        return n.where(x > _SOFTPLUS_THRESHOLD, x, n.log1p(n.exp(n.minimum(x, 30.0))))


def elu_plus_one(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """elu(x) + 1: x + 1 above 0, e^x below."""
    n = _ns(xp)
    return n.where(x > 0, x + 1.0, n.exp(n.minimum(x, 0.0)))


def relu(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    return _ns(xp).maximum(x, 0.0)


def identity(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    return x.copy()


#: The activations a config may name (feature maps, q/k activations, output gates).
ACTIVATIONS = {
    "silu": silu,
    "swish": silu,
    "sigmoid": sigmoid,
    "relu": relu,
    "elu": elu_plus_one,  # DeltaNet's qk_activation 'elu' is elu + 1 (fla's elu_p1)
    "identity": identity,
}


def _fusable(x: np.ndarray, ndim: int) -> bool:
    return x.ndim == ndim and x.dtype in (np.float32, np.float64)


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float, *, xp: Any = None) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) · w over the last axis (one fused pass, `fused.rms_norm`, for
    2-D float32/float64 x on the host)."""
    if xp is None and _fusable(x, 2):
        return _fused().rms_norm(x, w, eps)
    n = _ns(xp)
    ms = n.einsum("...d,...d->...", x, x) / x.shape[-1]
    y = x * (1.0 / n.sqrt(ms + eps))[..., None].astype(x.dtype, copy=False)
    if w is not None:
        y *= w
    return y


def add_rms_norm(
    x: np.ndarray,
    a: np.ndarray,
    w: np.ndarray | None,
    eps: float,
    *,
    xp: Any = None,
    rounded: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(h = x + a, rms_norm(h, w, eps)) for [T, D] arrays of one dtype: a block's residual and
    its next norm (one fused pass, `fused.add_rms_norm`, for float32/float64 on the host;
    rounded: the norm may come rounded to bfloat16 where that pass writes it so, for the
    bfloat16 products, which round their input as it would)."""
    if xp is None and _fusable(x, 2) and a.dtype == x.dtype and a.shape == x.shape:
        return _fused().add_rms_norm(x, a, w, eps, rounded)
    h = x + a
    return h, rms_norm(h, w, eps, xp=xp)


def layer_norm(
    x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float, *, xp: Any = None
) -> np.ndarray:
    """(x − mean(x)) / sqrt(var(x) + eps) · w + b over the last axis (torch's LayerNorm: the
    biased variance)."""
    n = _ns(xp)
    xc = x - x.mean(axis=-1, keepdims=True)
    var = n.einsum("...d,...d->...", xc, xc) / x.shape[-1]
    y = xc * (1.0 / n.sqrt(var + eps))[..., None].astype(x.dtype, copy=False)
    if w is not None:
        y *= w
    if b is not None:
        y += b
    return y


def head_norm(
    o: np.ndarray,
    w: np.ndarray | None,
    eps: float,
    gate: np.ndarray | None = None,
    act: str = "swish",
    *,
    xp: Any = None,
) -> np.ndarray:
    """rms_norm over each head's d_v of o [T, H, d_v], times ACTIVATIONS[act](gate) [T, H, d_v]
    when a gate is given (fla's FusedRMSNormGated; RMSNorm without one).  For float32/float64
    and the swish gate (or none) one fused pass (`fused.head_norm`), whose output is
    C-contiguous whatever o's strides (o [T, H, d] as a view of the recurrence's [H, T, d]):
    the output projection reads it as [T, H·d] without a copy."""
    fusable = gate is None or (act in ("swish", "silu") and gate.dtype == o.dtype)
    if xp is None and _fusable(o, 3) and fusable:
        return _fused().head_norm(o, w, eps, gate)
    y = rms_norm(o, w, eps, xp=xp)
    if gate is not None:
        y *= ACTIVATIONS[act](gate, xp=xp)
    return y if xp is None else xp.ascontiguousarray(y)


def swiglu(
    gate: np.ndarray, up: np.ndarray, *, xp: Any = None, rounded: bool = False
) -> np.ndarray:
    """silu(gate) · up for [T, D] arrays (fla's GatedMLP with hidden_act 'swish'), one fused
    pass (`fused.swiglu`) on the host (rounded: written rounded to bfloat16 there, as
    `add_rms_norm`'s)."""
    if xp is not None:
        return silu(gate, xp=xp) * up
    return _fused().swiglu(gate, up, rounded)


def short_conv(
    x: np.ndarray,
    tail: np.ndarray,
    w: np.ndarray,
    silu_after: bool,
    heads: int | None = None,
    l2_scale: float | None = None,
    *,
    xp: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Depthwise causal convolution of width W over a chunk x [T, D].

    tail [W−1, D]: the raw inputs of the W−1 tokens before the chunk (zeros at a sequence's
    start), oldest first; w [D, W], the newest input meeting w[:, W−1]:

        y_t[d] = Σ_j w[d, j] · x_{t−W+1+j}[d]          (then SiLU if silu_after)

    Returns (y [T, D] in x's dtype, the new tail [W−1, D] in tail's dtype: the last W−1 raw
    inputs, the chunk's own or, for a chunk shorter than W−1, partly the old tail's).  With
    heads = d, y comes head-major [D/d, T, d] (`head_major`), and with l2_scale each head
    L2-normalized and times it (`l2_heads`).  One fused pass (`fused.short_conv`,
    `fused_heads.conv_heads`) for 2-D float32/float64 x."""
    if xp is None and x.ndim == 2 and x.dtype in (np.float32, np.float64) and w.shape[1] > 1:
        if heads is None:
            return _fused().short_conv(x, tail, w, silu_after)
        l2, scale = l2_scale is not None, 1.0 if l2_scale is None else l2_scale
        y = _fused_heads().conv_heads(x, tail, w, silu_after, heads, l2, scale, _L2_EPS)
        return y, _fused().conv_tail(x, tail, w.shape[1] - 1)
    n = _ns(xp)
    t = x.shape[0]
    width = w.shape[1]
    xt = n.concatenate([tail.astype(x.dtype, copy=False), x], axis=0)  # [W−1+T, D]
    y = xt[0:t] * w[:, 0]
    for j in range(1, width):
        y += xt[j : j + t] * w[:, j]
    new_tail = n.array(xt[t:], dtype=tail.dtype)
    if silu_after:
        y = silu(y, xp=xp)
    if heads is not None:
        y = head_major(y, heads, xp=xp) if l2_scale is None else l2_heads(y, heads, l2_scale, xp=xp)
    return y, new_tail


def l2_norm(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """x / sqrt(Σx² + 1e-6) over the last axis."""
    n = _ns(xp)
    ss = n.einsum("...d,...d->...", x, x)
    return x * (1.0 / n.sqrt(ss + _L2_EPS))[..., None].astype(x.dtype, copy=False)


def l2_heads(x: np.ndarray, d: int, scale: float = 1.0, *, xp: Any = None) -> np.ndarray:
    """l2_norm per head of d of x [T, H·d], times scale, head-major [H, T, d]
    (`families.head_major`'s layout): `l2_norm(head_major(x, d)) · scale` in one fused pass
    (`fused.l2_heads`) for float32/float64."""
    if xp is None and _fusable(x, 2):
        return _fused().l2_heads(x, d, _L2_EPS, scale)
    h = l2_norm(head_major(x, d, xp=xp), xp=xp)
    h *= x.dtype.type(scale)
    return h


def sum_norm(x: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """x / max(Σ|x|, 1e-6) over the last axis."""
    ns = _ns(xp)
    n = ns.maximum(ns.abs(x).sum(axis=-1, keepdims=True), _SUM_EPS)
    return x / n.astype(x.dtype, copy=False)


def rotary_tables(dim: int, start: int, t: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [t, dim/2] of the angles p · base^(−2i/dim) for p = start .. start + t − 1,
    read-only (every layer of a chunk asks for the same tables: formed once, `_tables`).

    The angles are formed in float64 from the integer positions, so a position far into an
    unbounded stream is as exact as the first (fla forms them in float32, whose positions stop
    being integers past 2^24 tokens); the tables are then rounded to the compute dtype."""
    return _tables(int(dim), int(start), int(t), np.dtype(dtype))


@functools.lru_cache(maxsize=8)
def _tables(dim: int, start: int, t: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    # the last few chunks' tables (a model's layers, a few sequences at once): RetNet ~110M's 12
    # layers formed them 12 times a chunk, 1.7% of a 2,048-token float32 chunk
    inv_freq = 1.0 / (ROTARY_BASE ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    pos = np.arange(start, start + t, dtype=np.float64)
    ang = pos[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    cos.setflags(write=False)
    sin.setflags(write=False)
    return cos, sin


def rotary_heads(
    x: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    d: int,
    scale: float | None = None,
    repeat: int = 1,
    *,
    xp: Any = None,
) -> np.ndarray:
    """x [T, H·d] rotated per head (`rotary`), times scale unless None, head-major
    [H·repeat, T, d] (`head_major`): RetNet's q and k, one fused pass
    (`fused_heads.rotary_heads`, the same bits) for float32/float64 on the host."""
    if xp is None and _fusable(x, 2):
        return _fused_heads().rotary_heads(x, cos, sin, d, scale, repeat)
    t = x.shape[0]
    y = rotary(x.reshape(t, -1, d), cos, sin, xp=xp)
    if scale is not None:
        y *= x.dtype.type(scale)
    return head_major(y.reshape(t, -1), d, repeat, xp=xp)


def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, *, xp: Any = None) -> np.ndarray:
    """x [T, H, dim] rotated: [x1·cos − x2·sin, x2·cos + x1·sin] with x1, x2 its two halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return _ns(xp).concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
