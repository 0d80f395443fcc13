"""The interface of the family modules (gla, retnet, delta_net, gated_deltanet, hgrn2, one per
model_type), its defaults, and what the families share: head layouts and short convolutions.

A family module `ops/model/fla/<model_type>.py` (listed in `config.FAMILIES`) defines

    parse(reader, common) -> Spec
        its settings from config.json (a frozen dataclass; `config.ConfigReader` reads a key
        with its default and refuses a value by name); every key it does not read is refused.

and, for fla's standard block (the default: RMSNorm → mixer → residual → RMSNorm → SwiGLU MLP
→ residual, `block.StandardBlock`), its token mixer:

    attn_tensors(spec, common) -> {name: shape}    the mixer's tensors, under `attn.` in a layer
    build(spec, common, tensors, weights, index, model) -> Mixer
        the mixer of layer `index` from its `attn.` tensors (names under `attn.`); `model`: the
        model-level tensors (`model_tensors`), `weights`: the load's `dense.Weights` factory,
        through which every tensor goes (`weights.dense`/`weights.fused` for each matrix the
        layer multiplies by, `weights.array` for everything else; see `dense`).

A family computes through `weights.ops` and `weights.xp` only (never NumPy or a Numba kernel
directly): the same code runs on the host and on a device (backend "cupy", `compute`, `device`).

A module writes only what differs from these defaults:

    parse_common(reader) -> CommonConfig           default: `config.standard_common` (fla's keys:
                                                   hidden_size, num_hidden_layers, vocab_size,
                                                   norm_eps, intermediate_size or hidden_ratio,
                                                   hidden_act 'swish', no hybrid attention)
    layout(spec, common) -> block.ModelLayout      default: ModelLayout() (prefix `model.`,
                                                   `embeddings.weight`, final RMSNorm
                                                   `norm.weight`, layers under `layers.{i}.`)
    model_tensors(spec, common) -> {name: shape}   default: {} (tensors outside the layers, under
                                                   the prefix, e.g. HGRN2's lower bounds)
    layer_tensors(spec, common, index) -> {name: shape}
                                                   default: `block.standard_layer_tensors` with
                                                   attn_tensors (names under layer i's prefix)
    build_block(spec, common, tensors, weights, index, model) -> block.Block
                                                   default: `block.build_standard_block` with
                                                   build (tensors: layer_tensors' names)

The loader (`folder`) asks `Family` for these, in this order: the layout; the expected tensors
(prefix + embedding [vocab, hidden], the final norm's tensors [hidden], model_tensors, then each
layer's layer_tensors under prefix + layers + f"{i}."), checked against the folder before any
is read; then it reads the embedding, the final norm, the model tensors, and layer by layer the
layer's tensors, handing them (by their names under the layer's prefix) to build_block.  A
Block's forward is `forward(x, state, carry) -> (y, new_state)` (`block`); its state is a
`state.LayerState` of its `state_spec` (named arrays of fixed shape; every layer the same spec).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from .block import (
    Block,
    ModelLayout,
    build_standard_block,
    standard_layer_tensors,
)
from .config import CommonConfig
from .dense import Weights
from .pieces import head_major

__all__ = ["ConvSet", "Family", "family", "head_major", "row_major"]

_STANDARD_LAYOUT = ModelLayout()


class Family:
    """A family module with the interface's defaults filled in (see the module docstring)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def _own(self, name: str) -> Any:
        return getattr(self.module, name, None)

    def layout(self, spec: Any, c: CommonConfig) -> ModelLayout:
        own = self._own("layout")
        return _STANDARD_LAYOUT if own is None else own(spec, c)

    def model_tensors(self, spec: Any, c: CommonConfig) -> dict[str, tuple[int, ...]]:
        own = self._own("model_tensors")
        return {} if own is None else dict(own(spec, c))

    def layer_tensors(self, spec: Any, c: CommonConfig, index: int) -> dict[str, tuple[int, ...]]:
        own = self._own("layer_tensors")
        if own is not None:
            return dict(own(spec, c, index))
        return standard_layer_tensors(c, self.module.attn_tensors(spec, c))

    def build_block(
        self,
        spec: Any,
        c: CommonConfig,
        tensors: Mapping[str, Any],
        weights: Weights,
        index: int,
        model: Mapping[str, Any],
    ) -> Block:
        own = self._own("build_block")
        if own is not None:
            block: Block = own(spec, c, tensors, weights, index, model)
            return block
        build = self.module.build
        return build_standard_block(
            c, tensors, weights, lambda attn: build(spec, c, attn, weights, index, model)
        )


def family(name: str) -> Family:
    """The family of model_type `name` (a checked member of config.FAMILIES)."""
    return Family(importlib.import_module(f"{__package__}.{name}"))


def row_major(o: np.ndarray) -> np.ndarray:
    """[H, T, d] -> [T, H, d] (a view)."""
    return o.transpose(1, 0, 2)


class ConvSet:
    """A layer's short convolutions: weights [D, 1, W] by name (as loaded), their tails carried
    as `conv_<name>` state arrays [W−1, D].  `silu` names the ones followed by SiLU; the
    convolution is the factory's compute backend's (`factory.ops.short_conv`)."""

    def __init__(
        self, weights: Mapping[str, Any], silu: set[str] | frozenset[str], factory: Weights
    ) -> None:
        xp = factory.ops.xp
        self.w = {n: xp.ascontiguousarray(factory.array(a)[:, 0, :]) for n, a in weights.items()}
        self.silu = frozenset(silu)
        self.ops = factory.ops

    def state_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(f"conv_{n}", (w.shape[1] - 1, w.shape[0])) for n, w in self.w.items()]

    def __call__(
        self,
        name: str,
        x: np.ndarray,
        state: Mapping[str, np.ndarray],
        new: dict[str, Any],
        heads: int | None = None,
        l2_scale: float | None = None,
    ) -> np.ndarray:
        """conv `name` over x [T, D] from the state's tail; the new tail goes into `new`.  With
        heads (and l2_scale), written head-major (and L2-normalized): `pieces.short_conv`."""
        w, silu = self.w[name], name in self.silu
        y, tail = self.ops.short_conv(x, state[f"conv_{name}"], w, silu, heads, l2_scale)
        new[f"conv_{name}"] = tail
        return y
