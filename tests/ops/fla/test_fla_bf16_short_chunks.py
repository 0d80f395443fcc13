"""The widening bfloat16 engine on short chunks: each column range of a product widens its own
rows of the weight on its own thread; the hidden states and carried states stay the float32
mode's on the weights as loaded (it widens for the same products), bit for bit, over 64-token
chunks whose products have two column ranges."""

from __future__ import annotations

import numpy as np
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.mkl_engines import mapping_engine
from linstream.ops.model import threads
from linstream.ops.model.fla import load_model
from linstream.ops.model.fla.f32 import F32_ENV

SEED = 20261207
ENV = "LINSTREAM_BF16_PRODUCTS"


def test_short_chunks_widened_per_column_range_are_the_float32_mode(tmp_path, monkeypatch):
    print(f"seed {SEED}")
    # hidden 128, MLP 512: the MLP's products have outputs of 512 columns, two column ranges
    cfg = {**TINY_CONFIGS["gla"], "hidden_size": 128, "num_heads": 2, "intermediate_size": 512}
    assert len(threads.row_ranges(512)) == 2
    folder = write_folder(tmp_path / "gla", cfg, dtype="BF16", seed=6)
    monkeypatch.setenv(F32_ENV, mapping_engine("float32"))  # the float32 products unpacked
    f32 = load_model(folder)
    monkeypatch.setenv(ENV, "widen")
    b16 = load_model(folder, compute_dtype="bfloat16")
    ids = np.random.default_rng(SEED).integers(0, 50, 256)
    want_st = got_st = None
    for a in range(0, len(ids), 64):
        want, want_st = f32.hidden_states(ids[a : a + 64], want_st)
        got, got_st = b16.hidden_states(ids[a : a + 64], got_st)
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g), a
    for w, g in zip(want_st, got_st, strict=True):
        assert all(np.array_equal(w[k], g[k]) for k in w)
