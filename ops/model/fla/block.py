"""A model's layout and blocks: where its tensors are, its final norm, and fla's standard block
(RMSNorm → token mixer → residual → RMSNorm → SwiGLU MLP → residual), the default of every
family (`families`).

    layout = ModelLayout()      # fla's: model.embeddings.weight, model.norm.weight, layer i
                                # under model.layers.{i}.
    names = standard_layer_tensors(common, attn)  # a standard layer's tensors and shapes
    block = build_standard_block(common, tensors, weights, build_mixer)
    y, new_state = block.forward(x, state, carry)

A Block maps the residual stream x [T, hidden] (compute dtype; not written) and its layer's
LayerState to (its output [T, hidden], the new LayerState); `carry` is one dict per chunk's
forward, empty at its start and handed to every block in order, for values a later layer reads
from an earlier one within the chunk (never across chunks: that is the state's job).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from .compute import HOST, Compute
from .config import CommonConfig
from .dense import Dense, FusedProjection, Weights
from .state import LayerState, StateSpec

__all__ = [
    "Block",
    "Mixer",
    "ModelLayout",
    "Norm",
    "NormSpec",
    "StandardBlock",
    "build_standard_block",
    "held_arrays",
    "standard_layer_tensors",
]

NORM_KINDS = ("rms", "layer")


@dataclass(frozen=True)
class NormSpec:
    """A norm over the hidden size: RMSNorm ("rms": x / sqrt(mean(x²) + eps) · weight) or
    LayerNorm ("layer": (x − mean) / sqrt(var + eps) · weight + bias), its tensors' names (None:
    without), eps None for the config's norm_eps."""

    kind: str = "rms"
    weight: str | None = "norm.weight"
    bias: str | None = None
    eps: float | None = None

    def tensors(self, hidden: int) -> dict[str, tuple[int, ...]]:
        return {n: (hidden,) for n in (self.weight, self.bias) if n is not None}


@dataclass(frozen=True)
class ModelLayout:
    """Where a model's tensors are in its folder (fla's layout by default).

    prefixes: the first one any tensor of the folder starts with is the prefix of every name
    (none found: the names are bare, as a base model saves them); embedding: the token
    embedding [vocab, hidden]; final_norm: the norm after the last block (its output is the
    last hidden state); layers: layer i's tensors are under f"{prefix}{layers}{i}."; ignored:
    bare names a prefixed folder may hold that the runtime does not read (the output head)."""

    prefixes: tuple[str, ...] = ("model.",)
    embedding: str = "embeddings.weight"
    final_norm: NormSpec = NormSpec()
    layers: str = "layers."
    ignored: tuple[str, ...] = ("lm_head.weight",)


class Norm:
    """A NormSpec with its tensors: `norm(x)` over x's last axis, in x's dtype, computed by
    `ops` (the host's by default; `build`: the factory's)."""

    def __init__(
        self,
        kind: str,
        weight: np.ndarray | None,
        bias: np.ndarray | None,
        eps: float,
        ops: Compute = HOST,
    ) -> None:
        if kind not in NORM_KINDS:
            msg = f"norm kind must be one of {list(NORM_KINDS)}, got {kind!r}"
            raise ValueError(msg)
        self.kind, self.weight, self.bias, self.eps = kind, weight, bias, eps
        self.ops = ops

    @classmethod
    def build(
        cls, spec: NormSpec, tensors: Mapping[str, Any], weights: Weights, eps: float
    ) -> Norm:
        """The norm of `spec` from its tensors by name (eps: the config's, unless spec has one)."""
        w = None if spec.weight is None else weights.array(tensors[spec.weight])
        b = None if spec.bias is None else weights.array(tensors[spec.bias])
        return cls(spec.kind, w, b, eps if spec.eps is None else spec.eps, weights.ops)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.kind == "rms":
            return self.ops.rms_norm(x, self.weight, self.eps)
        return self.ops.layer_norm(x, self.weight, self.bias, self.eps)


class Mixer(Protocol):
    """A standard block's token mixer: the normed input x [T, hidden] and the layer's state to
    (output [T, hidden], the new LayerState), in the compute dtype."""

    state_spec: StateSpec

    def forward(self, x: np.ndarray, state: LayerState) -> tuple[np.ndarray, LayerState]: ...


class Block(Protocol):
    """One layer of a model (see the module docstring)."""

    state_spec: StateSpec

    def forward(
        self, x: np.ndarray, state: LayerState, carry: dict[str, Any]
    ) -> tuple[np.ndarray, LayerState]: ...


class StandardBlock:
    """fla's pre-norm block: attn_norm, the mixer, mlp_norm, the SwiGLU MLP (gate|up fused),
    computed by `ops`."""

    def __init__(
        self,
        attn_norm: np.ndarray,
        mixer: Mixer,
        mlp_norm: np.ndarray,
        gate_up: FusedProjection,
        down: Dense,
        eps: float,
        ops: Compute = HOST,
    ) -> None:
        self.attn_norm, self.mixer, self.mlp_norm = attn_norm, mixer, mlp_norm
        self.gate_up, self.down, self.eps = gate_up, down, eps
        self.ops = ops
        self.state_spec = mixer.state_spec
        # the MLP's inputs written rounded to bfloat16 where its products round them anyway
        # (one pass less each: the bfloat16 mode on the host)
        self._rounded = (_rounds(gate_up), _rounds(down))

    def forward(
        self, x: np.ndarray, state: LayerState, carry: dict[str, Any]
    ) -> tuple[np.ndarray, LayerState]:
        ops = self.ops
        norm_rounded, act_rounded = self._rounded
        a, new = self.mixer.forward(ops.rms_norm(x, self.attn_norm, self.eps), state)
        x, normed = ops.add_rms_norm(x, a, self.mlp_norm, self.eps, norm_rounded)  # x: new
        p = self.gate_up(normed)
        x += self.down(ops.swiglu(p["gate"], p["up"], act_rounded))
        return x, new


def _rounds(product: Any) -> bool:
    """Whether a product rounds its input to bfloat16 (`bf16.Engine.rounds`)."""
    engine = getattr(product, "engine", None)
    return engine is not None and engine.rounds


def standard_layer_tensors(
    c: CommonConfig, attn: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """A standard layer's tensors (names under the layer's prefix), the mixer's `attn` under
    `attn.`."""
    d, m = c.hidden_size, c.intermediate_size
    out: dict[str, tuple[int, ...]] = {
        "attn_norm.weight": (d,),
        "mlp_norm.weight": (d,),
        "mlp.gate_proj.weight": (m, d),
        "mlp.up_proj.weight": (m, d),
        "mlp.down_proj.weight": (d, m),
    }
    out.update({f"attn.{n}": s for n, s in attn.items()})
    return out


def build_standard_block(
    c: CommonConfig,
    tensors: Mapping[str, Any],
    weights: Weights,
    build_mixer: Callable[[dict[str, Any]], Mixer],
) -> StandardBlock:
    """A standard block from its layer's tensors (`standard_layer_tensors`' names);
    build_mixer gets the `attn.` tensors by their names under it."""
    attn = {n.removeprefix("attn."): a for n, a in tensors.items() if n.startswith("attn.")}
    return StandardBlock(
        attn_norm=weights.array(tensors["attn_norm.weight"]),
        mixer=build_mixer(attn),
        mlp_norm=weights.array(tensors["mlp_norm.weight"]),
        gate_up=weights.fused(
            [("gate", tensors["mlp.gate_proj.weight"]), ("up", tensors["mlp.up_proj.weight"])]
        ),
        down=weights.dense(tensors["mlp.down_proj.weight"]),
        eps=c.norm_eps,
        ops=weights.ops,
    )


def held_arrays(obj: Any) -> list[np.ndarray]:
    """The arrays an object holds: an array itself, what its `arrays()` gives (a Dense), or
    those among its attributes, dict values and list items, recursively."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, (Dense, FusedProjection)):
        return obj.arrays()
    if isinstance(obj, Compute):  # the backend a block computes with holds no weights
        return []
    if isinstance(obj, dict):
        values: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        values = vars(obj).values()
    else:
        return []
    return [a for v in values for a in held_arrays(v)]
