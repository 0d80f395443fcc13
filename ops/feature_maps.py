"""Feature maps φ applied to raw queries and keys, each token on its own (causal by construction).

Every map is written against an array namespace `xp` (NumPy or CuPy) so that all backends share
one definition.  A map's parameters (FAVOR+'s random matrix) are part of the model and of the
checkpoint fingerprint: `params()` returns them and `config()` says how to rebuild them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "FEATURE_MAPS",
    "EluPlusOne",
    "FavorPlus",
    "FeatureMap",
    "Identity",
    "Relu",
    "get_feature_map",
]


class FeatureMap:
    """Base class: maps [..., d_in] to [..., out_dim(d_in)], elementwise over leading axes."""

    name: str = ""

    def out_dim(self, d_in: int) -> int:
        return d_in

    def __call__(self, x: Any, xp: Any = np) -> Any:
        raise NotImplementedError

    def query(self, x: Any, xp: Any = np) -> Any:
        """φ for queries.  Same as `__call__` except where a map may rescale each query token on
        its own (a per-token factor cancels in the ratio num/den); keys always use `__call__`."""
        return self(x, xp=xp)

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


def _orthogonal_rows(rng: np.random.Generator, d: int) -> np.ndarray:
    """d orthonormal rows in float64 by modified Gram-Schmidt of a Gaussian matrix.

    Written with elementwise NumPy (no LAPACK QR) so the result does not depend on which
    LAPACK a machine has, nor on QR's sign convention: the matrix is a model parameter.
    """
    g = rng.standard_normal((d, d))
    for i in range(d):
        for j in range(i):
            g[i] -= np.sum(g[i] * g[j]) * g[j]
        g[i] /= np.sqrt(np.sum(g[i] * g[i]))
    return g


class FavorPlus(FeatureMap):
    """Positive orthogonal random features for the softmax kernel (Performer's FAVOR+).

    φ(x) = exp(Wx' - |x'|²/2) / sqrt(m) with x' = x / d^(1/4), so that E[φ(q)·φ(k)] =
    exp(q·k / sqrt(d)).  W [m, d]: blocks of d orthonormal rows, each row scaled by the norm of
    an independent Gaussian d-vector; generated from (d, m, seed) by NumPy alone and rounded to
    float32 (that matrix *is* the map; `params(d)` returns it for the fingerprint).

    Stabilization is causal: keys use the exact features (Wx' - |x'|²/2 = |w|²/2 - |x'-w|²/2
    is bounded by the parameters, so no data can overflow them); queries (`query`) subtract
    their own per-token maximum exponent, which cancels between numerator and denominator.
    No statistic over other tokens is used (Performer's key max over the sequence would leak
    the future).
    """

    name = "favor+"

    def __init__(self, num_features: int | None = None, seed: int = 0) -> None:
        if num_features is not None and (
            isinstance(num_features, bool) or int(num_features) != num_features or num_features < 1
        ):
            msg = f"favor+: num_features must be a positive integer or None, got {num_features!r}"
            raise ValueError(msg)
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            msg = f"favor+: seed must be a non-negative integer, got {seed!r}"
            raise ValueError(msg)
        self.num_features = None if num_features is None else int(num_features)
        self.seed = int(seed)
        self._cache: dict[int, np.ndarray] = {}

    def out_dim(self, d_in: int) -> int:
        return d_in if self.num_features is None else self.num_features

    def matrix(self, d_in: int) -> np.ndarray:
        """W [m, d_in] float32, the same for the same (d_in, m, seed) on every machine."""
        w = self._cache.get(d_in)
        if w is None:
            m = self.out_dim(d_in)
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, d_in, m]))
            blocks = [_orthogonal_rows(rng, d_in) for _ in range(-(-m // d_in))]
            rows = np.concatenate(blocks, axis=0)[:m]
            norms = np.sqrt(np.sum(rng.standard_normal((m, d_in)) ** 2, axis=1))
            w = (rows * norms[:, None]).astype(np.float32)
            w.setflags(write=False)
            self._cache[d_in] = w
        return w

    def _exponent(self, x: Any, xp: Any) -> Any:
        d = x.shape[-1]
        w = xp.asarray(self.matrix(d), dtype=x.dtype)
        xs = x * x.dtype.type(d**-0.25)
        return xs @ w.T - 0.5 * xp.sum(xs * xs, axis=-1, keepdims=True)

    def __call__(self, x: Any, xp: Any = np) -> Any:
        m = self.out_dim(x.shape[-1])
        return xp.exp(self._exponent(x, xp)) * x.dtype.type(m**-0.5)

    def query(self, x: Any, xp: Any = np) -> Any:
        m = self.out_dim(x.shape[-1])
        u = self._exponent(x, xp)
        u = u - xp.max(u, axis=-1, keepdims=True)
        return xp.exp(u) * x.dtype.type(m**-0.5)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "num_features": self.num_features, "seed": self.seed}

    def params(self, d_in: int) -> dict[str, np.ndarray]:
        return {"W": self.matrix(d_in)}

    def __repr__(self) -> str:
        return f"FavorPlus(num_features={self.num_features}, seed={self.seed})"


FEATURE_MAPS: dict[str, type[FeatureMap]] = {
    EluPlusOne.name: EluPlusOne,
    Relu.name: Relu,
    Identity.name: Identity,
    FavorPlus.name: FavorPlus,
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
    try:
        return FEATURE_MAPS[name](**cfg)
    except TypeError as ex:
        msg = f"bad parameters for feature map {name!r}: {cfg!r} ({ex})"
        raise ValueError(msg) from ex
