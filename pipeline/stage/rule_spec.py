"""The update rule of `CausalLinearAttention`: its fixed arguments, the per-token inputs a chunk
carries for it, and how the rule is named in fingerprints and messages.

The rule and its fixed parameters (``gamma``, ``normalize``) are arguments of the transform; the
per-token inputs come with each chunk beside q/k/v: ``log_alpha`` [T, H] for ``gated`` and
``gated_delta``, ``beta`` [T, H] for ``delta`` and ``gated_delta`` (docs/rules.md).

A non-additive rule's fingerprint is ``<sha256 hex> <JSON of the rule>``: the hash covers the
feature map, eps and the rule; the JSON lets a refused resume say which rule the checkpoint was
written under.  The additive rule adds nothing, so its fingerprint is the one every store
written before the rules existed holds.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from linstream.ops.rules import (
    DECAYING_RULES,
    PER_TOKEN_INPUTS,
    RULES,
    check_rule,
    check_rule_backend,
)

__all__ = ["RuleSpec", "describe_fingerprint", "fingerprint_rule", "rule_label"]

#: What each per-token input must hold (for messages).
EXPECTED_VALUES = {
    "log_alpha": "finite log gates <= 0 (α = exp(log_alpha) in (0, 1])",
    "beta": "finite step sizes in (0, 1]",
}


def _one_line(prefix: str, ex: Exception) -> str:
    return f"{prefix}: {ex}".replace("\n", " ")


class RuleSpec:
    """The checked rule arguments of one transform (raises ValueError with one line)."""

    def __init__(self, rule: Any, gamma: Any, normalize: Any, backend: str) -> None:
        where = "CausalLinearAttention"
        if not isinstance(rule, str) or rule not in RULES:
            msg = f"{where}: rule must be one of {list(RULES)}, got {rule!r}"
            raise ValueError(msg)
        if not isinstance(normalize, bool | np.bool_):
            msg = f"{where}: normalize must be True or False, got {normalize!r}"
            raise ValueError(msg)
        if not normalize and rule not in DECAYING_RULES:
            msg = (
                f"{where}: normalize=False is for rules {list(DECAYING_RULES)} (additive always "
                f"normalizes, the delta rules have no normalizer), got rule {rule!r}"
            )
            raise ValueError(msg)
        if gamma is not None and rule != "decay":
            msg = f"{where}: gamma is an argument of rule 'decay', not of rule {rule!r}"
            raise ValueError(msg)
        self.gamma: float | tuple[float, ...] | None = None
        if rule == "decay":
            if gamma is None:
                msg = f"{where}: rule 'decay' needs gamma (a number or one per head, in (0, 1))"
                raise ValueError(msg)
            g = np.asarray(gamma)
            if g.ndim > 1 or g.size == 0:
                msg = f"{where}: gamma must be a number or a list [H] (one per head), got {gamma!r}"
                raise ValueError(msg)
            try:
                check_rule(rule, 1, max(1, g.size), gamma=gamma, normalize=bool(normalize))
            except (ValueError, TypeError) as ex:
                raise ValueError(_one_line(where, ex)) from ex
            self.gamma = float(g) if g.ndim == 0 else tuple(float(x) for x in g)
        if rule != "additive":
            try:
                check_rule_backend(rule, backend)
            except ValueError as ex:
                raise ValueError(_one_line(where, ex)) from ex
        self.rule = rule
        self.normalize = bool(normalize)
        self.inputs = PER_TOKEN_INPUTS[rule]  # the [T, H] inputs each chunk carries

    def heads(self) -> int | None:
        """The number of heads gamma fixes (None: any)."""
        return len(self.gamma) if isinstance(self.gamma, tuple) else None

    def config(self) -> dict[str, Any] | None:
        """What the fingerprint records (None for additive, whose fingerprint stays as it was)."""
        if self.rule == "additive":
            return None
        gamma = list(self.gamma) if isinstance(self.gamma, tuple) else self.gamma
        return {"rule": self.rule, "gamma": gamma, "normalize": self.normalize}

    def label(self) -> str:
        return rule_label(self.config())

    def kwargs(self, data: Any) -> dict[str, Any]:
        """The rule's arguments of `causal_linear_attention` for one (checked) payload."""
        if self.rule == "additive":
            return {}
        kw: dict[str, Any] = {"rule": self.rule, "normalize": self.normalize}
        if self.gamma is not None:
            kw["gamma"] = np.asarray(self.gamma, dtype=np.float64)
        for name in self.inputs:
            kw[name] = data[name]
        return kw


def rule_label(config: Any) -> str:
    """ "rule 'decay' (gamma 0.9, normalize True)" from a fingerprint's rule record."""
    if not config:
        return "rule 'additive'"
    parts = []
    if config.get("gamma") is not None:
        parts.append(f"gamma {config['gamma']}")
    if config.get("rule") in DECAYING_RULES:
        parts.append(f"normalize {config.get('normalize')}")
    extra = f" ({', '.join(parts)})" if parts else ""
    return f"rule {config.get('rule')!r}{extra}"


def fingerprint_rule(fingerprint: str) -> dict[str, Any] | None:
    """The rule record a non-additive fingerprint carries after its hash, or None."""
    _hash, sep, tail = fingerprint.partition(" ")
    if not sep:
        return None
    try:
        config = json.loads(tail)
    except ValueError:
        return None
    return config if isinstance(config, dict) and "rule" in config else None


def describe_fingerprint(fingerprint: str, additive: str, own: dict[str, Any] | None) -> str:
    """What a checkpoint's fingerprint says it was written under, for a refused resume:
    ``additive`` is the additive fingerprint of this job's feature map and eps, ``own`` this
    job's rule record."""
    if fingerprint == additive:
        return rule_label(None)
    config = fingerprint_rule(fingerprint)
    if config is None:
        return f"another feature map, eps or model (fingerprint {fingerprint[:16]}…)"
    if config == own:
        return f"{rule_label(config)} with another feature map or eps"
    return rule_label(config)
