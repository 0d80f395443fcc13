"""The roof benchmark's profile (tests/helpers/fla_profile.py) sees every kind of work of each
family's forward: products, the recurrence kernel, the passes between them.  Runs in `make test`
on tiny folders (its figures are shares of a tiny chunk, not timings), so a change of how the
families call their kernels or passes cannot silently zero a column of the benchmark's table."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.fla_folders import TINY_CONFIGS, write_folder
from helpers.fla_profile import KINDS, Profile
from helpers.rwkv_mamba_models import write_model_folder
from linstream.ops.model.fla import load_model

# every family the runtime loads
FAMILIES = ("gla", "retnet", "delta_net", "hgrn2", "gated_deltanet", "rwkv7", "mamba2")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_profile_sees_products_recurrence_and_passes(family, tmp_path):
    folder = tmp_path / family
    if family in ("rwkv7", "mamba2"):
        write_model_folder(folder, family, "tiny", seed=0)
    else:
        write_folder(folder, TINY_CONFIGS[family], seed=0)
    model = load_model(folder)
    ids = np.arange(64) % model.config.common.vocab_size
    model.embed_chunk(ids, None)  # compile outside the profile
    with Profile() as prof:
        model.embed_chunk(ids, None)
    seen = {k: prof.calls[k] for k in KINDS}
    for kind in ("products", "recurrence", "norms and activations"):
        assert seen[kind] > 0, f"{family}: the profile saw no {kind} call ({seen})"
    # and it undoes its wrapping: a second forward outside it is not counted
    before = dict(prof.calls)
    model.embed_chunk(ids, None)
    assert prof.calls == before
