"""Update rules of the carried state beyond the additive one (see docs/rules.md).

decay_recurrent, gated_recurrent            float64 references, token by token
delta_recurrent, gated_delta_recurrent      float64 references, token by token
decay_chunks, delta_chunks                  chunkwise Numba kernels
dplr_recurrent, dplr_chunks                 the generalized delta rule (DPLR form, RWKV-7's time
                                            mix): its reference and kernel, which the fla runtime
                                            calls (no `rule=` name)
rule_causal                                 what `causal_linear_attention(rule=...)` calls
"""

from linstream.ops.decay.naive import decay_recurrent, gated_recurrent
from linstream.ops.decay.numba import decay_chunks
from linstream.ops.delta.naive import delta_recurrent, gated_delta_recurrent, unit_keys
from linstream.ops.delta.numba import delta_chunks
from linstream.ops.dplr.naive import dplr_recurrent
from linstream.ops.dplr.numba import dplr_chunks

from .dispatch import DEFAULT_RULE_CHUNK, check_rule_backend, rule_causal
from .params import (
    DECAYING_RULES,
    DELTA_RULES,
    PARAMETERS,
    PER_TOKEN_INPUTS,
    RULES,
    RuleInputs,
    check_rule,
)

__all__ = [
    "DECAYING_RULES",
    "DEFAULT_RULE_CHUNK",
    "DELTA_RULES",
    "PARAMETERS",
    "PER_TOKEN_INPUTS",
    "RULES",
    "RuleInputs",
    "check_rule",
    "check_rule_backend",
    "decay_chunks",
    "decay_recurrent",
    "delta_chunks",
    "delta_recurrent",
    "dplr_chunks",
    "dplr_recurrent",
    "gated_delta_recurrent",
    "gated_recurrent",
    "rule_causal",
    "unit_keys",
]
