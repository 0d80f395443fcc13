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
        """φ for queries.  Same as `__call__` except where a map rescales each query token on its
        own: then `query(x) = exp(-query_shift(x)) · features(x)`; keys always use `__call__`."""
        return self(x, xp=xp)

    def features(self, x: Any, xp: Any = np) -> Any:
        """The textbook φ(x), no rescaling at all (what the references use for queries)."""
        return self(x, xp=xp)

    def query_shift(self, x: Any, xp: Any = np) -> Any | None:
        """Per-token log factor s [..., 1] with `query(x) = exp(-s) · features(x)`, or None when
        `query` does not rescale.  It cancels in num/den only when eps is scaled with it."""
        return None

    def query_and_shift(self, x: Any, xp: Any = np) -> tuple[Any, Any | None]:
        """(query(x), query_shift(x)), computed together where that saves work."""
        return self.query(x, xp=xp), self.query_shift(x, xp=xp)

    def key_shift(self, d_in: int) -> float:
        """Constant b with `__call__(k) = exp(-b) · features(k)` for keys of width d_in: a state
        built from `__call__` is exp(-b) times the textbook one (0 for every fixed map)."""
        return 0.0

    def config(self) -> dict[str, Any]:
        """JSON-able description from which `get_feature_map` rebuilds this map."""
        return {"name": self.name}

    def state_constants(self, d_in: int) -> dict[str, float]:
        """Constants, beyond `params`, that shape the carried state for inputs of width d_in
        and so belong to a fingerprint: FAVOR+'s key shift b where b > 0 (empty otherwise, so
        a map with b = 0 fingerprints as it did before b was recorded)."""
        b = self.key_shift(d_in)
        return {"key_shift": float(b)} if b != 0.0 else {}

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


# Largest key exponent kept after the constant key shift: exp(60) ≈ 1.1e26 leaves float32 room
# (3.4e38) for sums of ~10^12 such keys times values, and costs typical keys nothing unless
# B > 60 (d·m large); see FavorPlus.
KEY_EXP_MAX = 60.0


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

    Stabilization is causal and uses no statistic of other tokens (Performer's key max over the
    sequence would leak the future):

    - keys: the exponent Wx' - |x'|²/2 = |w|²/2 - |x'-w|²/2 is at most B = max_i |w_i|²/2, a
      constant of the parameters.  B reaches ~100 for d=128, m=4096, past float32's exp limit
      (~88.7), so keys carry the constant factor exp(-b), b = max(0, B - KEY_EXP_MAX)
      (`key_shift`), and their exponent is clamped at B (rounding only).  The state is then
      exp(-b) times the textbook state; b depends on W alone, so it is fixed by the fingerprint.
    - queries (`query`): each token subtracts its own largest exponent s (`query_shift`).  With
      the constant key factor the ratio stays the textbook one when eps is applied as
      eps · exp(-s - b) (the unscaled domain): y = φ(q)ᵀS / (φ(q)ᵀz + eps) exactly.
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
        self._bounds: dict[int, float] = {}

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

    def exponent_bound(self, d_in: int) -> float:
        """B = max_i |w_i|²/2 (float64 of the float32 W): no input's exponent exceeds it."""
        b = self._bounds.get(d_in)
        if b is None:
            w = self.matrix(d_in).astype(np.float64)
            b = self._bounds[d_in] = float(0.5 * np.max(np.sum(w * w, axis=1)))
        return b

    def key_shift(self, d_in: int) -> float:
        return max(0.0, self.exponent_bound(d_in) - KEY_EXP_MAX)

    def _exponent(self, x: Any, xp: Any) -> Any:
        d = x.shape[-1]
        w = xp.asarray(self.matrix(d), dtype=x.dtype)
        xs = x * x.dtype.type(d**-0.25)
        return xs @ w.T - 0.5 * xp.sum(xs * xs, axis=-1, keepdims=True)

    def features(self, x: Any, xp: Any = np) -> Any:
        m = self.out_dim(x.shape[-1])
        return xp.exp(self._exponent(x, xp)) * x.dtype.type(m**-0.5)

    def __call__(self, x: Any, xp: Any = np) -> Any:
        d = x.shape[-1]
        m = self.out_dim(d)
        bound, shift = self.exponent_bound(d), self.key_shift(d)
        u = xp.minimum(self._exponent(x, xp), x.dtype.type(bound)) - x.dtype.type(shift)
        return xp.exp(u) * x.dtype.type(m**-0.5)

    def query_shift(self, x: Any, xp: Any = np) -> Any:
        return xp.max(self._exponent(x, xp), axis=-1, keepdims=True)

    def query(self, x: Any, xp: Any = np) -> Any:
        m = self.out_dim(x.shape[-1])
        u = self._exponent(x, xp)
        u = u - xp.max(u, axis=-1, keepdims=True)
        return xp.exp(u) * x.dtype.type(m**-0.5)

    def query_and_shift(self, x: Any, xp: Any = np) -> tuple[Any, Any]:
        """(query(x), query_shift(x)) from one evaluation of the exponent."""
        m = self.out_dim(x.shape[-1])
        u = self._exponent(x, xp)
        s = xp.max(u, axis=-1, keepdims=True)
        return xp.exp(u - s) * x.dtype.type(m**-0.5), s

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
