"""The ~1.3B rows of the device check: tokens/s at 2,048-token chunks of a random ~1.3B GLA and
RWKV-7 configuration, linstream's CuPy runtime (bfloat16 mode) beside fla's forward (bfloat16).

Last in the device check's priority (gpu_check_all.py): a family starts only when its estimated
cost fits before the run's deadline, else one line says it was skipped and why.  The estimate:
a family's phase-1 wall time at ~110M (gpu_check_fla.Session.write_s: writing the tiny and the
~110M folder, loading each twice, short runs; dominated by the ~110M weights' generation,
writing and loading, linear in the parameters) x BIG_RATIO (1.3B / 110M, ~12), plus
COMPILE_S for fla's Triton autotuning at the new shapes (pruned to 4 configurations per kernel)
and the timed calls (at 2,048 tokens, 2 x 1.3e9 x 2,048 = 5.3 TFLOP per chunk: ~15 ms in
bfloat16 at the H200's measured ~790 TFLOP/s matrix rate halved, x 7 calls x 2 runtimes: under
a second).  On paper, for the H200 (16 cores, NumPy's generator ~5 s per 110M float32 normals
with writing and two loads): ~5 s x 12 + 30 s = ~90 s a family, ~3 minutes for both, which
fits the 9-minute budget only when the rows before it end early.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import gpu_check_fla as fla_check
import numpy as np

#: ~1.3B configurations: fla's GLA 1.3B (hidden 2,048, 24 layers, 4 heads; 1.37B with the
#: embedding and lm_head) and RWKV-7's 1.5B ranks at hidden 2,048 (1.39B)
BIG13: dict[str, dict[str, Any]] = {
    "gla": {"model_type": "gla", "hidden_size": 2048, "num_hidden_layers": 24, "num_heads": 4,
            "expand_k": 0.5, "expand_v": 1.0, "vocab_size": 32000},
    "rwkv7": {"model_type": "rwkv7", "hidden_size": 2048, "num_hidden_layers": 24,
              "head_dim": 64, "intermediate_size": 8192, "decay_low_rank_dim": 96,
              "a_low_rank_dim": 96, "v_low_rank_dim": 64, "gate_low_rank_dim": 256,
              "vocab_size": 32000},
}  # fmt: skip
BIG_RATIO = 12.0  # 1.37B / 0.134B = 10.2 (lm_heads included), rounded up
COMPILE_S = 30.0  # fla's Triton compilation and autotuning at the new shapes, and the timing


def estimate_s(session: fla_check.Session) -> float:
    """The on-device estimate of one family's 1.3B rows (see the module docstring)."""
    return BIG_RATIO * session.write_s + COMPILE_S


def run(session: fla_check.Session, timed: Any, deadline_s: float) -> None:
    """The 1.3B rows into session.rows, each family only when its estimate fits before
    deadline_s (seconds since gpu_check_fla.T0); otherwise a row and a line say it was skipped."""
    from linstream.ops.model.fla import load_model

    print("\n[6] ~1.3B configurations (GLA, RWKV-7): tokens/s at 2,048-token chunks, bfloat16")
    for fam, cfg in BIG13.items():
        if fla_check.DRY_RUN:
            from helpers.fla_folders import TINY_CONFIGS

            cfg = {**TINY_CONFIGS[fam], "vocab_size": 128, "num_hidden_layers": 2}
        est = estimate_s(session)
        left = deadline_s - fla_check._elapsed()
        if est > left:
            why = f"skipped: estimated {est:.0f} s, {max(left, 0):.0f} s of the budget left"
            print(f"  {fam:<15s} 1.3B  {why}")
            session.rows.append({"family": fam, "size": "1.3B", "check": "tokens/s",
                                 "ok": True, "skipped": why})  # fmt: skip
            continue
        session.rows += fla_check._guarded(
            fam, lambda fam=fam, cfg=cfg: _rows(session, fam, cfg, timed, load_model)
        )


def _rows(
    session: fla_check.Session, fam: str, cfg: dict[str, Any], timed: Any, load_model: Any
) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    folder = fla_check.write(Path(session.root), fam, "1.3B", cfg)
    x = np.random.default_rng(1).integers(0, cfg["vocab_size"], fla_check.CHUNK)

    def speed(impl: str, fn: Any) -> None:
        sec = timed(fn)
        n = fla_check.CHUNK
        rows.append({"family": fam, "size": "1.3B", "check": "tokens/s", "impl": impl,
                     "dtype": "bfloat16", "ok": True, "tokens_per_s": n / sec,
                     "ms": sec * 1e3})  # fmt: skip
        print(f"       {fam:<15s} 1.3B  {impl:<20s} bfloat16 {n / sec:12.0f} tokens/s")

    ours = load_model(folder, compute_dtype="bfloat16")
    st = ours.initial_states()
    speed("linstream cupy", lambda: ours.embed_chunk(x, st, backend="cupy"))
    fla = session.fla
    if fla is not None:
        fb = fla.load(folder, fla.torch.bfloat16)
        xt = fla.torch.as_tensor(x, device=fla.dev)[None]
        speed("fla forward (cache)", lambda: fla.chunk(fb, xt))
    print(f"       {fam:<15s} 1.3B  took {time.perf_counter() - t0:.0f} s "
          f"(estimated {estimate_s(session):.0f} s)")  # fmt: skip
    for p in folder.iterdir():  # 2.7 GB of weights: the disk is 64 GiB
        p.unlink()
    return rows
