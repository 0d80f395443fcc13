"""Feature maps φ applied to raw queries and keys, each token on its own (causal by construction).

Every map is written against an array namespace `xp` (NumPy or CuPy) so that all backends share
one definition.  A map's parameters (FAVOR+'s random matrix) are part of the model and of the
checkpoint fingerprint: `params()` returns them and `config()` says how to rebuild them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["FEATURE_MAPS", "EluPlusOne", "FeatureMap", "Identity", "Relu", "get_feature_map"]


class FeatureMap:
    """Base class: maps [..., d_in] to [..., out_dim(d_in)], elementwise over leading axes."""

    name: str = ""

    def out_dim(self, d_in: int) -> int:
        return d_in

    def __call__(self, x: Any, xp: Any = np) -> Any:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """JSON-able description from which `get_feature_map` rebuilds this map."""
        return {"name": self.name}

    def params(self, d_in: int) -> dict[str, np.ndarray]:
        """Arrays that define the map for inputs of width d_in (empty for fixed maps)."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class EluPlusOne(FeatureMap):
    """φ(x) = elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise (Katharopoulos et al., §3.2)."""

    name = "elu+1"

    def __call__(self, x: Any, xp: Any = np) -> Any:
        return xp.where(x > 0, x + 1, xp.exp(xp.minimum(x, 0)))


class Relu(FeatureMap):
    name = "relu"

    def __call__(self, x: Any, xp: Any = np) -> Any:
        return xp.maximum(x, 0)


class Identity(FeatureMap):
    """No map: scores can be negative, so use it only where the denominator stays positive."""

    name = "identity"

    def __call__(self, x: Any, xp: Any = np) -> Any:
        return x


FEATURE_MAPS: dict[str, type[FeatureMap]] = {
    EluPlusOne.name: EluPlusOne,
    Relu.name: Relu,
    Identity.name: Identity,
}


def get_feature_map(spec: str | dict[str, Any] | FeatureMap) -> FeatureMap:
    """Return the feature map named by `spec` (a name, a `config()` dict, or a map itself)."""
    if isinstance(spec, FeatureMap):
        return spec
    if isinstance(spec, dict):
        cfg = dict(spec)
        name = cfg.pop("name", None)
    else:
        name, cfg = spec, {}
    if name not in FEATURE_MAPS:
        msg = f"unknown feature map {name!r}; expected one of {sorted(FEATURE_MAPS)}"
        raise ValueError(msg)
    return FEATURE_MAPS[name](**cfg)
