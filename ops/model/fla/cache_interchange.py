"""A sequence's carried state as flash-linear-attention's (fla's) cache object, and back.

    cache = to_fla_cache(model, states, position=p, device="cuda", dtype=torch.float32)
    out = fla_model(next_ids, past_key_values=cache, use_cache=True)     # continues in fla
    states = from_fla_cache(model, out.past_key_values)                  # and back
    emb, states = model.embed_chunk(more_ids, states)                    # continues here

`model` is the `FlaModel` the states belong to; the cache is fla 0.6.0's
`fla.models.utils.Cache` for the same checkpoint, batch size 1, every layer a dict of
`recurrent_state`, `conv_state`, `ffn_state` (and `attn_state`, unused by these families).
What each family's layer keeps there, against linstream's names (`state`):

    gla, hgrn2, gated_deltanet   recurrent_state [1, H, V, K]  = S [H, K, V] transposed
    delta_net, retnet            recurrent_state [1, H, K, V]  = S
    + a short conv (not retnet)  conv_state (q, k, v) / (q, f, i), each [1, D, W]: the last W
                                 raw inputs, oldest first = conv_* [W−1, D] transposed, plus
                                 the oldest input, which no later output reads (fla's own
                                 context-parallel conv fills it with zeros too)
    retnet                       the cache's seen-token count = position (its rotary offset)
    rwkv7                        recurrent_state [1, H, K, V] = S; conv_state [1, D] =
                                 shift_attn; ffn_state [1, D] = shift_ffn
    mamba2                       recurrent_state [1, H, P, N] = S; conv_state [1, D, W] =
                                 conv_xbc [W−1, D] transposed, plus the oldest input (as above)

Every cache layer counts `position` seen tokens (fla's `get_seq_length()`), which is where the
next token's position starts.

Exactness: the numbers are copied, never recomputed.  `to_fla_cache` with `dtype=None` keeps
the states' dtype (float64 or float32): exact; a narrower dtype (torch.float32 for a float64
state, torch.bfloat16) rounds each number once to the nearest (ties to even), as torch's
conversion does.  `from_fla_cache` widens fla's float32 or bfloat16 numbers to float64 (the
default) exactly; to float32 it is exact from float32 or bfloat16 and rounds from float64.  So
`from_fla_cache(to_fla_cache(s))` is `s` bit for bit whenever the cache dtype holds the state's
dtype; the other way, fla's cache comes back with its unread oldest conv input set to zero.

Refused with one line (ValueError): a cache whose layers are not the model's (count, which
arrays, shapes: both named), a cache of more than one sequence without `batch_index`, a
retnet state whose layers disagree with the position given, and a model of a family for which
this table has no entry.  Torch and fla are imported when called (ImportError in one line if
missing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from .state import POSITION, LayerState

if TYPE_CHECKING:
    from .runtime import FlaModel

__all__ = ["FLA_CACHE_FAMILIES", "from_fla_cache", "to_fla_cache"]

#: family -> (its recurrent state is value-major in fla's cache, its conv tails are one tuple)
_LAYOUTS: dict[str, tuple[bool, bool]] = {
    "gla": (True, True),
    "hgrn2": (True, True),
    "gated_deltanet": (True, True),
    "delta_net": (False, True),
    "retnet": (False, True),
    "rwkv7": (False, False),
    "mamba2": (False, False),
}
#: the families whose state converts to and from fla's cache
FLA_CACHE_FAMILIES = tuple(_LAYOUTS)
_SHIFTS = {"shift_attn": "conv_state", "shift_ffn": "ffn_state"}  # rwkv7


def _torch() -> Any:
    try:
        import torch
    except ImportError as ex:  # pragma: no cover - torch comes with the fla extra
        msg = "fla's cache needs PyTorch and flash-linear-attention 0.6.0: pip install torch"
        raise ImportError(msg) from ex
    return torch


def _fla_cache_class() -> Any:
    _torch()
    try:
        from fla.models.utils import Cache
    except ImportError as ex:
        msg = (
            "fla's cache needs flash-linear-attention (0.6.0), which is not installed: "
            f"pip install flash-linear-attention==0.6.0 ({ex})"
        )
        raise ImportError(msg) from None
    return Cache


def _family(model: FlaModel) -> str:
    family = model.config.common.family
    if family not in _LAYOUTS:
        msg = (
            f"fla has no cache layout known for {family} models (this converts "
            f"{', '.join(FLA_CACHE_FAMILIES)})"
        )
        raise ValueError(msg)
    return family


def _expected(model: FlaModel) -> dict[str, Any]:
    """What one layer of fla's cache holds for this model: key -> shape, or a list of shapes
    for a tuple of conv tails (batch 1)."""
    family = _family(model)
    value_major, conv_tuple = _LAYOUTS[family]
    spec = dict(model.state_specs[0].shapes)
    s = spec["S"]
    out: dict[str, Any] = {"recurrent_state": (1, s[0], s[2], s[1]) if value_major else (1, *s)}
    convs = [(n, sh) for n, sh in spec.items() if n.startswith("conv_")]
    if conv_tuple:
        out["conv_state"] = [(1, sh[1], sh[0] + 1) for _, sh in convs] or None
    elif convs:  # mamba2: one conv over x, B and C
        (_, sh), *_ = convs
        out["conv_state"] = (1, sh[1], sh[0] + 1)
    for name, key in _SHIFTS.items():
        if name in spec:
            out[key] = (1, *spec[name])
    return out


def _describe(layer: Mapping[str, Any]) -> str:
    parts = []
    for key in ("recurrent_state", "conv_state", "ffn_state", "attn_state"):
        v = layer.get(key)
        if v is None or (isinstance(v, list | tuple) and not v):
            continue
        if isinstance(v, list | tuple):
            shapes = [list(getattr(t, "shape", ())) for t in v]
            parts.append(f"{key} {len(v)} × {shapes[0]}" if len(set(map(str, shapes))) == 1
                         else f"{key} {shapes}")  # fmt: skip
        else:
            parts.append(f"{key} {list(getattr(v, 'shape', ()))}")
    return ", ".join(parts) or "nothing"


def _model_name(model: FlaModel) -> str:
    c = model.config.common
    return f"the {c.family} model {model.source} ({c.num_layers} layers, {model.fingerprint[:12]})"


def _shape_of(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return [tuple(t.shape) for t in v]
    return None if v is None else tuple(v.shape)


def _tensor(torch: Any, a: np.ndarray, device: Any, dtype: Any) -> Any:
    t = torch.from_numpy(np.array(a, order="C", copy=True))  # fla writes its cache in place
    return t.to(device=device, dtype=dtype)


def _conv_to_fla(torch: Any, tail: np.ndarray, device: Any, dtype: Any) -> Any:
    """conv tail [W−1, D] -> fla's conv cache [1, D, W] (the unread oldest input zero)."""
    w1, d = tail.shape
    full = np.zeros((1, d, w1 + 1), dtype=tail.dtype)
    full[0, :, 1:] = tail.T
    return _tensor(torch, full, device, dtype)


def _torch_dtype(torch: Any, dtype: Any, state_dtype: np.dtype) -> Any:
    if dtype is None:
        return torch.float64 if state_dtype == np.float64 else torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        msg = f"dtype: expected a floating torch dtype (torch.float32, ...) or None, got {dtype!r}"
        raise TypeError(msg)
    return dtype


def to_fla_cache(
    model: FlaModel,
    states: Sequence[LayerState],
    *,
    position: int | None = None,
    device: Any = "cpu",
    dtype: Any = None,
) -> Any:
    """fla's `Cache` holding `states` (the runtime's per-layer states of one sequence) for
    fla's model of the same checkpoint, batch size 1, on `device`, each layer having seen
    `position` tokens.

    position: the tokens the sequence has consumed; optional for RetNet, whose states carry it
    (a different value is refused), required for the other families.  dtype: the cache's
    torch dtype; None keeps the states' (exact), a narrower one rounds to nearest (see the
    module docstring).  The tensors are copies: fla may update them in place."""
    torch = _torch()
    cache_class = _fla_cache_class()
    family = _family(model)
    st = model.check_states(states)
    carried = {int(s[POSITION][0]) for s in st if POSITION in s}
    if len(carried) > 1:
        msg = f"the states' layers carry different positions {sorted(carried)}: not one sequence"
        raise ValueError(msg)
    if position is None:
        if not carried:
            msg = (
                f"position: a {family} state does not carry its position; pass position= (the "
                "tokens the sequence has consumed)"
            )
            raise ValueError(msg)
        position = next(iter(carried))
    if isinstance(position, bool) or not isinstance(position, int | np.integer) or position < 0:
        msg = f"position: expected a whole number >= 0, got {position!r}"
        raise ValueError(msg)
    position = int(position)
    if carried and carried != {position}:
        msg = (
            f"the states carry position {sorted(carried)}, the sequence is at {position}: a "
            "state must advance by the tokens it consumed"
        )
        raise ValueError(msg)
    value_major, conv_tuple = _LAYOUTS[family]
    tdtype = _torch_dtype(torch, dtype, st[0].dtype)
    cache = cache_class()
    for i, s in enumerate(st):
        rec = s["S"].transpose(0, 2, 1) if value_major else s["S"]
        names = [n for n in model.state_specs[i].names() if n.startswith("conv_")]  # fla's order
        convs = [_conv_to_fla(torch, s[n], device, tdtype) for n in names]
        conv: Any = None
        if convs:
            conv = tuple(convs) if conv_tuple else convs[0]
        shifts = {
            key: _tensor(torch, s[name][None], device, tdtype)
            for name, key in _SHIFTS.items()
            if name in s
        }
        if "conv_state" in shifts:
            conv = shifts.pop("conv_state")
        cache.update(
            recurrent_state=_tensor(torch, rec[None], device, tdtype),
            conv_state=conv,
            layer_idx=i,
            offset=position,
            **shifts,
        )
    cache._seen_tokens = position
    return cache


def _layers(cache: Any) -> list[Mapping[str, Any]]:
    if isinstance(cache, Sequence) and not isinstance(cache, str | bytes):
        layers = list(cache)  # the legacy format: a tuple of per-layer dicts
    elif hasattr(cache, "__len__") and hasattr(cache, "__getitem__"):
        layers = [cache[i] for i in range(len(cache))]
    else:
        msg = (
            f"expected fla's Cache (or its legacy tuple of layer dicts), got {type(cache).__name__}"
        )
        raise TypeError(msg)
    for i, layer in enumerate(layers):
        if not isinstance(layer, Mapping):
            msg = f"fla cache layer {i}: expected a dict of states, got {type(layer).__name__}"
            raise TypeError(msg)
    return layers


def _seen_tokens(cache: Any) -> int | None:
    get = getattr(cache, "get_seq_length", None)
    return None if get is None else int(get())


def _numpy(t: Any, row: int, dtype: np.dtype) -> np.ndarray:
    torch = _torch()
    want = torch.float64 if dtype == np.float64 else torch.float32
    return t.detach()[row].to(device="cpu", dtype=want).numpy()


def from_fla_cache(
    model: FlaModel,
    cache: Any,
    *,
    dtype: npt.DTypeLike = np.float64,
    batch_index: int | None = None,
) -> list[LayerState]:
    """The runtime's per-layer states (in `dtype`, float64 by default, float32 selectable) from
    fla's cache of the same checkpoint: the sequence continues with `model.embed_chunk(ids,
    states)`.  The position is the cache's `get_seq_length()` (RetNet's states carry it).

    batch_index: which sequence of a batched cache (required when it holds more than one)."""
    torch = _torch()
    family = _family(model)
    dt = np.dtype(dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        msg = f"dtype: expected float32 or float64, got {dt}"
        raise TypeError(msg)
    layers = _layers(cache)
    want = _expected(model)
    n = model.num_layers
    if len(layers) != n:
        first = _describe(layers[0]) if layers else "nothing"
        msg = (
            f"an fla cache of {len(layers)} layers (layer 0: {first}) does not fit "
            f"{_model_name(model)}, whose cache has {n} (each: {_describe_expected(want)})"
        )
        raise ValueError(msg)
    batch = {
        int(t.shape[0])
        for layer in layers
        for v in layer.values()
        for t in (v if isinstance(v, list | tuple) else [v])
        if isinstance(t, torch.Tensor) and t.dim() > 0
    }
    for i, layer in enumerate(layers):
        got = {k: _shape_of(layer.get(k)) for k in ("recurrent_state", "conv_state", "ffn_state")}
        got = {k: (None if v is None else _batch_one(v)) for k, v in got.items()}
        expect = {k: want.get(k) for k in got}
        expect = {k: (tuple(v) if isinstance(v, tuple) else v) for k, v in expect.items()}
        if got != expect or layer.get("attn_state") is not None:
            msg = (
                f"fla cache layer {i} holds {_describe(layer)}; {_model_name(model)} has "
                f"{_describe_expected(want)}: a cache from another architecture or shape"
            )
            raise ValueError(msg)
    if len(batch) != 1:
        msg = f"the fla cache's tensors hold {sorted(batch)} sequences: not one batch"
        raise ValueError(msg)
    if batch_index is None:
        if batch != {1}:
            msg = f"the fla cache holds {sorted(batch)} sequences: pass batch_index= to pick one"
            raise ValueError(msg)
        row = 0
    else:
        (size,) = batch
        if not 0 <= batch_index < size:
            msg = f"batch_index: expected 0 to {size - 1}, got {batch_index}"
            raise ValueError(msg)
        row = int(batch_index)
    seen = _seen_tokens(cache)
    value_major, _ = _LAYOUTS[family]
    out = []
    for i, layer in enumerate(layers):
        rec = _numpy(layer["recurrent_state"], row, dt)
        arrays: dict[str, np.ndarray] = {}
        convs = layer.get("conv_state")
        conv_list = [] if convs is None or family == "rwkv7" else (
            list(convs) if isinstance(convs, list | tuple) else [convs])  # fmt: skip
        conv_names = [n for n in model.state_specs[i].names() if n.startswith("conv_")]
        tails = {n: _numpy(t, row, dt)[:, 1:].T for n, t in zip(conv_names, conv_list, strict=True)}
        for name in model.state_specs[i].names():
            if name == "S":
                arrays[name] = rec.transpose(0, 2, 1) if value_major else rec
            elif name in tails:
                arrays[name] = tails[name]
            elif name in _SHIFTS:
                arrays[name] = _numpy(layer[_SHIFTS[name]], row, dt)
            elif name == POSITION:
                if seen is None:
                    msg = "a RetNet state needs the cache's seen-token count: pass fla's Cache"
                    raise ValueError(msg)
                arrays[name] = np.array([seen], dtype=np.int64)
        out.append(
            LayerState(
                {k: (a if k == POSITION else np.ascontiguousarray(a)) for k, a in arrays.items()}
            )
        )
    return out


def _batch_one(shape: Any) -> Any:
    if isinstance(shape, list):
        return [(1, *s[1:]) for s in shape]
    return (1, *shape[1:])


def _describe_expected(want: Mapping[str, Any]) -> str:
    parts = []
    for key, v in want.items():
        if v is None:
            continue
        if isinstance(v, list):
            parts.append(f"{key} {len(v)} × {list(v[0])}")
        else:
            parts.append(f"{key} {list(v)}")
    return ", ".join(parts)
