"""The update rules' names and parameter checks: each message says what was expected and what came.

    additive     S_t = S_{t-1} + φ(k_t)v_tᵀ                      (no parameters)
    decay        S_t = γ S_{t-1} + φ(k_t)v_tᵀ                    gamma: [H] or scalar, in (0, 1)
    gated        S_t = α_t S_{t-1} + φ(k_t)v_tᵀ                  log_alpha: [T, H], ≤ 0, finite
    delta        S_t = S_{t-1} + β_t k_t(v_t - S_{t-1}ᵀk_t)ᵀ      beta: [T, H], in (0, 1]
    gated_delta  S_t = α_t(I - β_t k_t k_tᵀ)S_{t-1} + β_t k_t v_tᵀ  log_alpha and beta

`check_rule` turns them into per-token float64 arrays [H, T]: log gates (0 where a rule has no
gate) and β (only for the delta rules).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "DECAYING_RULES",
    "DELTA_RULES",
    "PARAMETERS",
    "PER_TOKEN_INPUTS",
    "RULES",
    "RuleInputs",
    "check_rule",
]

RULES = ("additive", "decay", "gated", "delta", "gated_delta")
DECAYING_RULES = ("decay", "gated")
DELTA_RULES = ("delta", "gated_delta")

#: The rules that take each parameter: gamma is fixed per head; log_alpha and beta come with
#: every token ([T, H]).
PARAMETERS: dict[str, tuple[str, ...]] = {
    "gamma": ("decay",),
    "log_alpha": ("gated", "gated_delta"),
    "beta": ("delta", "gated_delta"),
}
#: The per-token inputs ([T, H]) of each rule, in order (a pipeline's chunks carry them).
PER_TOKEN_INPUTS: dict[str, tuple[str, ...]] = {
    rule: tuple(n for n in ("log_alpha", "beta") if rule in PARAMETERS[n]) for rule in RULES
}


class RuleInputs(NamedTuple):
    """A checked rule: name, log gates [H, T] float64, β [H, T] float64 (or None), normalize."""

    rule: str
    log_gate: np.ndarray
    beta: np.ndarray | None
    normalize: bool


def _per_token(name: str, x: Any, t: int, h: int) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        msg = f"{name} must be a real array of shape [T, H] = [{t}, {h}], got dtype {a.dtype}"
        raise TypeError(msg)
    if a.shape != (t, h):
        msg = f"{name} must have shape [T, H] = [{t}, {h}] (one per token and head), got {a.shape}"
        raise ValueError(msg)
    return np.ascontiguousarray(a.T, dtype=np.float64)


def _first_bad(a: np.ndarray, ok: np.ndarray) -> str:
    h, t = np.argwhere(~ok)[0]
    return f"token {t}, head {h}: {float(a[h, t])!r}"


def _gamma(gamma: Any, t: int, h: int) -> np.ndarray:
    g = np.asarray(gamma)
    if g.dtype.kind not in "fiu" or g.dtype == np.bool_:
        msg = f"gamma must be a real number or an array of shape [H] = [{h}], got dtype {g.dtype}"
        raise TypeError(msg)
    if g.ndim == 0:
        g = np.full(h, float(g))
    if g.shape != (h,):
        msg = f"gamma must be a number or an array of shape [H] = [{h}], got shape {g.shape}"
        raise ValueError(msg)
    g = g.astype(np.float64)
    bad = ~(np.isfinite(g) & (g > 0) & (g < 1))
    if bad.any():
        i = int(np.argmax(bad))
        msg = f"gamma must lie in (0, 1) for every head, got {float(g[i])!r} for head {i}"
        raise ValueError(msg)
    return np.repeat(np.log(g)[:, None], t, axis=1)


def check_rule(
    rule: Any,
    t: int,
    h: int,
    *,
    gamma: Any = None,
    log_alpha: Any = None,
    beta: Any = None,
    normalize: Any = True,
) -> RuleInputs:
    """Check the rule and its parameters for a chunk of T tokens and H heads."""
    if rule not in RULES:
        msg = f"unknown rule {rule!r}; expected one of {list(RULES)}"
        raise ValueError(msg)
    if not isinstance(normalize, bool | np.bool_):
        msg = f"normalize must be True or False, got {normalize!r}"
        raise TypeError(msg)
    given = {"gamma": gamma, "log_alpha": log_alpha, "beta": beta}
    for name, value in given.items():
        uses = PARAMETERS[name]
        if rule in uses and value is None:
            msg = f"rule {rule!r} needs {name} ({_shape_of(name, t, h)}), got None"
            raise ValueError(msg)
        if rule not in uses and value is not None:
            msg = f"{name} is a parameter of rule(s) {list(uses)}, not of rule {rule!r}; got one"
            raise ValueError(msg)
    if rule == "additive" and not normalize:
        msg = "normalize=False is for rules 'decay' and 'gated' (additive always normalizes)"
        raise ValueError(msg)
    log_gate = np.zeros((h, t))
    if rule == "decay":
        log_gate = _gamma(gamma, t, h)
    elif rule in ("gated", "gated_delta"):
        log_gate = _per_token("log_alpha", log_alpha, t, h)
        ok = np.isfinite(log_gate) & (log_gate <= 0)
        if not ok.all():
            msg = (
                "log_alpha must be finite and <= 0 (α = exp(log_alpha) in (0, 1]), got "
                + _first_bad(log_gate, ok)
            )
            raise ValueError(msg)
    b = None
    if rule in DELTA_RULES:
        b = _per_token("beta", beta, t, h)
        ok = np.isfinite(b) & (b > 0) & (b <= 1)
        if not ok.all():
            msg = "beta must lie in (0, 1] for every token and head, got " + _first_bad(b, ok)
            raise ValueError(msg)
    return RuleInputs(str(rule), log_gate, b, bool(normalize))


def _shape_of(name: str, t: int, h: int) -> str:
    if name == "gamma":
        return f"a number or an array [H] = [{h}] in (0, 1)"
    if name == "log_alpha":
        return f"an array [T, H] = [{t}, {h}] of log gates <= 0"
    return f"an array [T, H] = [{t}, {h}] in (0, 1]"
