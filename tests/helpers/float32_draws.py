"""Other float32 roundings of a model, for a tolerance derived from a float32 run's error.

    folders = perturbed_folders(folder)        # DRAWS copies beside it, float32 weights
    e32 = max(error(folder), *(error(f) for f in folders))   # each in the float32 mode

A float32 run differs from the float64 run of the same weights by its roundings, and that error
is one draw: its largest element's is not always typical.  Where the output is ill-conditioned
(a head whose attention output nearly cancels, rescaled by the head's norm) the error there
moved 35x between draws (tests/ops/fla/test_fla_device.py's module docstring), so a bound of a
few times one run's error fails an ordinary other evaluation order at times.  A perturbed copy
is the same model rounded another way: every weight times 1 + δ, δ uniform within ±2^-24
(float32's unit roundoff), seeded by the draw.  The largest error over the run as stored and
the copies' runs (all against the float64 run of the weights as stored) is the float32 error a
bound is derived from.  bfloat16 weights widened into float32 copies: for the float32 mode
(the bfloat16 mode would round the copies back to the weights as stored).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .fla_folders import write_safetensors

__all__ = ["DRAWS", "perturbed_folders"]

DRAWS = 2  # copies beside the run as stored: three draws in all


def perturbed_folders(folder: Path, draws: int = DRAWS) -> list[Path]:
    """`draws` copies of the model folder (its config.json, its weights in float32, each times
    1 + δ as the module docstring says), written beside it as <name>_draw<j> (written again
    each call, the same bytes)."""
    from linstream.ops.model.fla.tensor_files import map_tensor, read_header

    folder = Path(folder)
    tensors: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        for name, entry in read_header(str(f)).items():
            tensors[name] = np.array(map_tensor(entry), dtype=np.float32)
    out = []
    for j in range(draws):
        rng = np.random.default_rng(j)
        moved = {
            k: (a * (1 + 2.0**-24 * rng.uniform(-1, 1, a.shape))).astype(np.float32)
            for k, a in sorted(tensors.items())
        }
        copy = folder.parent / f"{folder.name}_draw{j}"
        copy.mkdir(exist_ok=True)
        (copy / "config.json").write_text((folder / "config.json").read_text())
        write_safetensors(copy / "model.safetensors", moved, dtype="F32")
        out.append(copy)
    return out
