"""The PyTorch twin of the embedding model: define and train it here, run it with the runtime.

Needs torch (`pip install linstream[torch]`); nothing else in `linstream.ops` imports this module.

    from linstream.ops import ModelConfig
    from linstream.ops.model.twin import TorchEmbeddingModel
    model = TorchEmbeddingModel(ModelConfig(vocab_size=1000), seed=0)
    emb = model(tokens)                 # tokens [B, T] or [T] -> [B, T, d_model] or [T, d_model]
    model.save("my.safetensors")        # load without torch: linstream.ops.load_model(path)

The forward pass is the runtime's (see `model_config`), written the plain way: the attention of a
whole sequence is the O(T²) masked form tril(φ(Q)φ(K)ᵀ)V / (tril(φ(Q)φ(K)ᵀ)1 + eps), optionally in
blocks of `chunk_size` tokens with the running sums carried between blocks (O(T·C) memory for
long training sequences; the same numbers).  `forward(..., states=..., return_states=True)`
continues from and returns per-layer states (S [B, H, F, d_head], z [B, H, F]), so the twin can
also run chunk by chunk like the runtime.

A layer whose config rule is not "additive" (`ModelConfig.rules`: decay, gated, delta,
gated_delta) has its gate (`attn.gate`, log α = logsigmoid(·)/tau) and β (`attn.beta`, sigmoid)
projections as `nn.Linear` modules and runs through the chunkwise forms of
`model_torch_rules` (blocks of `RULE_CHUNK` tokens unless `chunk_size` is given), so autograd
trains every rule; see docs/rules.md.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as fn
from linstream.ops.feature_maps import get_feature_map
from torch import nn

from .config import ModelConfig
from .twin_rules import decaying_attention, delta_attention, unit_keys
from .weights import (
    BETA_RULES,
    FEATURE_MAP_PREFIX,
    GATED_RULES,
    feature_map_params,
    init_weights,
    read_model,
    write_model,
)

__all__ = ["RULE_CHUNK", "TorchEmbeddingModel", "TorchFeatureMap", "TorchState"]

# Per layer: (S [B, H, F, d_head], z [B, H, F]).
TorchState = tuple[torch.Tensor, torch.Tensor]
# Tokens per block of a rule layer's chunkwise form when no chunk_size is given (the runtime's
# rule kernels use 64 too): the delta rules' triangular solve stays well conditioned.
RULE_CHUNK = 64


class TorchFeatureMap(nn.Module):
    """φ in torch, equal to `linstream.ops.get_feature_map(config)` (a test checks every map).

    The map's parameters (FAVOR+'s random matrix) are buffers named as in the model file
    (`feature_map.<name>`); they are not trained.
    """

    def __init__(self, config: dict[str, Any], d_in: int) -> None:
        super().__init__()
        self.spec = dict(config)
        self.name = str(config["name"])
        fm = get_feature_map(config)
        for key, arr in fm.params(d_in).items():
            self.register_buffer(key, torch.from_numpy(np.array(arr)))
        # FAVOR+ keys: exponents clamped at the map's bound and shifted by a constant (both fixed
        # by W), exactly as the runtime's map; other maps have no shift.
        self.key_shift = float(fm.key_shift(d_in))
        self.bound = float(getattr(fm, "exponent_bound", lambda d: np.inf)(d_in))
        if self.name not in ("elu+1", "relu", "identity", "favor+"):
            msg = f"feature map {self.name!r} has no torch version in TorchFeatureMap"
            raise NotImplementedError(msg)

    def forward(self, x: torch.Tensor, *, query: bool = False) -> torch.Tensor:
        """φ(x) over the last axis; `query=True` gives the map's query form (`FeatureMap.query`,
        which for FAVOR+ subtracts each query token's own largest exponent)."""
        if self.name == "elu+1":  # where(x > 0, x + 1, exp(x)), exactly as the NumPy map
            return torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0)))
        if self.name == "relu":
            return torch.relu(x)
        if self.name == "identity":
            return x
        return self._favor(x, query)

    def _favor(self, x: torch.Tensor, query: bool) -> torch.Tensor:
        # FavorPlus: exp(W x' - |x'|²/2) / sqrt(m), x' = x / d^(1/4); W is the buffer "W".
        w = self.get_buffer("W").to(x.dtype)
        d, m = x.shape[-1], w.shape[0]
        xs = x * (d**-0.25)
        u = xs @ w.T - 0.5 * (xs * xs).sum(-1, keepdim=True)
        if query:
            u = u - u.amax(-1, keepdim=True)
        else:
            u = torch.clamp(u, max=self.bound) - self.key_shift
        return torch.exp(u) * (m**-0.5)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The textbook φ(x) (`FeatureMap.features`): for FAVOR+ without the clamp and key shift
        (the delta rules read with it); the key form for the other maps."""
        if self.name != "favor+":
            return self(x)
        w = self.get_buffer("W").to(x.dtype)
        xs = x * (x.shape[-1] ** -0.25)
        u = xs @ w.T - 0.5 * (xs * xs).sum(-1, keepdim=True)
        return torch.exp(u) * (w.shape[0] ** -0.5)

    def log_eps_factor(self, x: torch.Tensor) -> torch.Tensor | None:
        """log of the factor eps is scaled by per query token (FAVOR+'s query rescaling and key
        shift cancel in the ratio only if eps is scaled with them); None for the other maps."""
        if self.name != "favor+":
            return None
        w = self.get_buffer("W").to(x.dtype)
        xs = x * (x.shape[-1] ** -0.25)
        u = xs @ w.T - 0.5 * (xs * xs).sum(-1, keepdim=True)
        return -u.amax(-1, keepdim=True) - self.key_shift


def _norm(config: ModelConfig) -> nn.Module:
    if config.normalization == "layernorm":
        return nn.LayerNorm(config.d_model, eps=config.norm_eps)
    return nn.RMSNorm(config.d_model, eps=config.norm_eps)


class _Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        d, a = config.d_model, config.d_attn
        self.q = nn.Linear(d, a, bias=False)
        self.k = nn.Linear(d, a, bias=False)
        self.v = nn.Linear(d, a, bias=False)
        spec = config.layer_rule(layer)
        self.rule = str(spec["rule"])
        self.normalize = bool(spec.get("normalize", True))
        self.tau = float(spec.get("tau", 1.0))
        if self.rule in GATED_RULES:  # log α = logsigmoid(x W_a + b_a) / tau, one per head
            self.gate = nn.Linear(d, config.n_heads)
        if self.rule in BETA_RULES:  # β = sigmoid(x W_b + b_b), one per head
            self.beta = nn.Linear(d, config.n_heads)
        if self.rule == "decay":  # fixed, from the config (not a stored tensor)
            log_gamma = torch.log(torch.tensor(spec["gamma"], dtype=torch.float64))
            self.register_buffer("log_gamma", log_gamma, persistent=False)
        self.o = nn.Linear(a, d, bias=False)
        self.h, self.dh, self.eps = config.n_heads, config.d_head, config.eps

    def forward(
        self,
        x: torch.Tensor,
        phi: TorchFeatureMap,
        state: TorchState | None,
        chunk_size: int | None,
    ) -> tuple[torch.Tensor, TorchState | None]:
        if self.rule != "additive":
            return self._rule_forward(x, phi, state, chunk_size)
        b, t, _ = x.shape
        # [B, H, T, d]: heads first, so each product below is a batched matmul.
        xq = self.q(x).view(b, t, self.h, self.dh)
        q = phi(xq, query=True).transpose(1, 2)
        lf = phi.log_eps_factor(xq)
        eps: Any = self.eps if lf is None else self.eps * torch.exp(lf.transpose(1, 2))
        k = phi(self.k(x).view(b, t, self.h, self.dh)).transpose(1, 2)
        v = self.v(x).view(b, t, self.h, self.dh).transpose(1, 2)
        s, z = state if state is not None else (None, None)
        c = t if not chunk_size else int(chunk_size)
        mask = torch.ones(c, c, dtype=torch.bool, device=x.device).tril()
        outs = []
        for i in range(0, t, c):
            qc, kc, vc = q[:, :, i : i + c], k[:, :, i : i + c], v[:, :, i : i + c]
            n = qc.shape[2]
            scores = (qc @ kc.transpose(-1, -2)).masked_fill(~mask[:n, :n], 0.0)
            num = scores @ vc
            den = scores.sum(-1, keepdim=True)
            if s is not None and z is not None:
                num = num + qc @ s.to(qc.dtype)
                den = den + qc @ z.to(qc.dtype).unsqueeze(-1)
            e = eps if lf is None else eps[:, :, i : i + c]
            outs.append(num / (den + e))
            if state is not None or i + c < t:  # the running sums, in the state's dtype
                ds, dz = kc.transpose(-1, -2) @ vc, kc.sum(2)
                sdt = s.dtype if s is not None else ds.dtype
                s = ds.to(sdt) if s is None else s + ds.to(sdt)
                z = dz.to(sdt) if z is None else z + dz.to(sdt)
        y = torch.cat(outs, dim=2).transpose(1, 2).reshape(b, t, self.h * self.dh)
        new = (s, z) if state is not None and s is not None and z is not None else None
        return self.o(y), new

    def _log_gates(self, x: torch.Tensor) -> torch.Tensor:
        """log α per head and token [B, H, T] (0 for the plain delta rule)."""
        b, t, _ = x.shape
        if self.rule == "decay":
            lg = self.get_buffer("log_gamma").to(x.dtype)
            return lg[None, :, None].expand(b, self.h, t)
        if self.rule in GATED_RULES:
            return (fn.logsigmoid(self.gate(x)) / self.tau).transpose(1, 2)
        return x.new_zeros(b, self.h, t)

    def _rule_forward(
        self,
        x: torch.Tensor,
        phi: TorchFeatureMap,
        state: TorchState | None,
        chunk_size: int | None,
    ) -> tuple[torch.Tensor, TorchState | None]:
        """A layer whose rule is not additive, through its chunkwise form (model_torch_rules)."""
        b, t, _ = x.shape
        c = RULE_CHUNK if not chunk_size else int(chunk_size)
        xq = self.q(x).view(b, t, self.h, self.dh)
        xk = self.k(x).view(b, t, self.h, self.dh)
        v = self.v(x).view(b, t, self.h, self.dh).transpose(1, 2)
        log_g = self._log_gates(x)
        if self.rule in ("decay", "gated"):
            q = phi(xq, query=True).transpose(1, 2)
            lf = phi.log_eps_factor(xq)
            lf = None if lf is None else lf.transpose(1, 2)
            eps: Any = self.eps if lf is None else self.eps * torch.exp(lf)
            y, (s, z) = decaying_attention(
                q, phi(xk).transpose(1, 2), v, log_g, state, eps=eps, normalize=self.normalize,
                log_f=lf, chunk=c,
            )  # fmt: skip
        else:
            q = phi.features(xq).transpose(1, 2)
            k = unit_keys(phi(xk)).transpose(1, 2)
            beta = torch.sigmoid(self.beta(x)).transpose(1, 2)
            y, s = delta_attention(
                q, k, v, log_g, beta, None if state is None else state[0], chunk=c
            )
            z = state[1] if state is not None else s.new_zeros(s.shape[:-1])  # carried as is
        y = y.transpose(1, 2).reshape(b, t, self.h * self.dh)
        return self.o(y), (s, z) if state is not None else None


class _FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.d_ff)
        self.down = nn.Linear(config.d_ff, config.d_model)
        self.activation = config.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = self.up(x)
        if self.activation == "relu":
            u = torch.relu(u)
        elif self.activation == "silu":
            u = fn.silu(u)
        else:
            u = fn.gelu(u, approximate="tanh")
        return self.down(u)


class _Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.norm1 = _norm(config)
        self.attn = _Attention(config, layer)
        self.norm2 = _norm(config)
        self.ff = _FeedForward(config)

    def forward(
        self,
        x: torch.Tensor,
        phi: TorchFeatureMap,
        state: TorchState | None,
        chunk_size: int | None,
    ) -> tuple[torch.Tensor, TorchState | None]:
        y, new = self.attn(self.norm1(x), phi, state, chunk_size)
        x = x + y
        return x + self.ff(self.norm2(x)), new


class TorchEmbeddingModel(nn.Module):
    """The embedding model as an `nn.Module` (see the module docstring).

    Parameter names are the model file's tensor names.  `seed` applies `init_weights(config,
    seed)`, the same NumPy initialization the built-in model uses; without it torch's default
    initialization stays.
    """

    def __init__(self, config: ModelConfig, *, seed: int | None = None) -> None:
        super().__init__()
        self.config = config
        if config.input_kind == "tokens":
            assert config.vocab_size is not None
            self.embed = nn.Embedding(config.vocab_size, config.d_model)
        else:
            assert config.input_dim is not None
            self.input_proj = nn.Linear(config.input_dim, config.d_model)
        self.layers = nn.ModuleList(_Block(config, i) for i in range(config.n_layers))
        self.final_norm = _norm(config)
        self.feature_map = TorchFeatureMap(config.feature_map, config.d_head)
        if seed is not None:
            self.load_numpy_weights(init_weights(config, seed))

    # -- weights and files ---------------------------------------------------------------------
    def load_numpy_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Copy NumPy tensors (named as in the model file) into the parameters and buffers."""
        sd = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
        own = self.state_dict()
        for k, v in sd.items():  # keep this module's dtype (e.g. after .double())
            if k in own:
                sd[k] = v.to(own[k].dtype)
        self.load_state_dict(sd, strict=True)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """The tensors a model file stores: float32 weights and the feature map's parameters."""
        fm_params = feature_map_params(self.config)
        out = {}
        for k, v in self.state_dict().items():
            a = v.detach().cpu().numpy()
            if k.startswith(FEATURE_MAP_PREFIX):  # stored as generated (even after .double())
                out[k] = a.astype(fm_params[k.removeprefix(FEATURE_MAP_PREFIX)].dtype)
            else:
                out[k] = a.astype(np.float32)
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a safetensors model file (config JSON in its metadata; float32 weights)."""
        write_model(path, self.config, self.numpy_weights())

    @classmethod
    def load(cls, path: str | os.PathLike[str] | bytes) -> TorchEmbeddingModel:
        """Read a model file (checked like `load_model` checks it) into a new module."""
        config, weights = read_model(path)
        model = cls(config)
        model.load_numpy_weights(weights)
        return model

    # -- forward -------------------------------------------------------------------------------
    def initial_states(
        self, batch: int = 1, dtype: torch.dtype = torch.float64
    ) -> list[TorchState]:
        c = self.config
        f = c.feature_dim
        dev = next(self.parameters()).device
        return [
            (
                torch.zeros(batch, c.n_heads, f, c.d_head, dtype=dtype, device=dev),
                torch.zeros(batch, c.n_heads, f, dtype=dtype, device=dev),
            )
            for _ in range(c.n_layers)
        ]

    def forward(
        self,
        inputs: torch.Tensor,
        states: Sequence[TorchState] | None = None,
        *,
        return_states: bool = False,
        chunk_size: int | None = None,
    ) -> Any:
        """inputs: token ids [B, T] or [T] (long), or features [B, T, input_dim] or [T, input_dim].

        Returns embeddings [B, T, d_model] ([T, d_model] for unbatched input); with
        return_states=True, (embeddings, new states).  `states` continues a sequence (None: its
        start; float64 zeros when states are returned); states always carry the batch axis
        (B = 1 for unbatched input).  `chunk_size` processes attention in
        blocks of that many tokens (None: the whole sequence at once).
        """
        c = self.config
        unbatched = inputs.dim() == (1 if c.input_kind == "tokens" else 2)
        if unbatched:
            inputs = inputs.unsqueeze(0)
        if c.input_kind == "tokens":
            x = self.embed(inputs)
        else:
            x = self.input_proj(inputs.to(self.input_proj.weight.dtype))
        if states is None and return_states:
            states = self.initial_states(x.shape[0])
        new_states = []
        for i, block in enumerate(self.layers):
            x, st = block(
                x, self.feature_map, states[i] if states is not None else None, chunk_size
            )
            new_states.append(st)
        emb = self.final_norm(x)
        if unbatched:
            emb = emb.squeeze(0)
        if return_states:
            return emb, new_states
        return emb
