"""A sequence's state moves between linstream and fla's own cache, both ways, per family.

fla is the outside oracle: flash-linear-attention 0.6.0 (pinned), its model classes on the CPU
with the Triton kernels rebound to its own naive references (`helpers.fla_oracle`,
`helpers.fla_oracle_rwkv7`, `helpers.fla_oracle_mamba2`).  Each family's tiny random checkpoint
is built with fla's classes and saved; linstream loads the same folder.  Both run in float32,
as fla runs on a GPU.  (fla's Mamba-2 on the CPU continues from a cache one token per call: its
continuations here are fed so.)

(a) linstream over a prefix -> `to_fla_cache` -> fla over the rest == fla over the whole;
(b) fla over the prefix -> `from_fla_cache` -> linstream over the rest == linstream over the
    whole;
(c) `from_fla_cache(to_fla_cache(s))` is s bit for bit, and fla's cache comes back through
    linstream bit for bit (but the oldest conv input, which nothing reads).

Tolerance, derived: X = linstream in float64 over the whole sequence stands for the exact
result (it equals fla's math in float64 to ~1e-14, tests/ops/fla/test_fla_oracle.py, far below
float32's errors).  Each side's float32 whole-sequence run differs from X by its measured
error, e_fla and e_lin (the rounding of that side's code at float32's unit roundoff).  A run
that switches sides at the prefix is a float32 evaluation of the same function in yet another
order (one side's kernels up to the prefix, the other's after, and the state rounded once to
float32 on the way): within FACTOR · max(e_fla, e_lin) of X, with FACTOR = 8 (3 bits for the
other summation order, as test_fla_oracle derives).  So it is within e_ref + FACTOR ·
max(e_fla, e_lin) of the side it is compared with (e_ref: that side's own error).  A wrong
layout (a transposed state, a shifted conv tail, a lost position) moves the outputs by O(1);
each test also checks that continuing from an empty cache misses by far more than the
tolerance, so the state is what is being tested.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("fla", reason="flash-linear-attention is a test extra (make test installs it)")

from helpers.fla_oracle import build_and_save, patch_fla_for_cpu, tiny_configs  # noqa: E402
from helpers.streaming import worst  # noqa: E402
from linstream.ops.model.fla import (  # noqa: E402
    FLA_CACHE_FAMILIES,
    from_fla_cache,
    load_model,
    to_fla_cache,
)

SEED = 20261204
T = 40  # tokens: the prefix and the continuation are drawn from SEED per family
FACTOR = 8  # see the module docstring
STANDARD = ["gla", "retnet", "delta_net", "gated_deltanet", "hgrn2"]
FAMILIES = [*STANDARD, "rwkv7", "mamba2"]
#: the oracle's other tiny configs (grouped key/value heads, grouped values, no convs, other
#: feature maps and gates): slow, `make slow` runs them
VARIANTS = [name for name in tiny_configs() if name not in FAMILIES]
MODELS = [*FAMILIES, *(pytest.param(v, marks=pytest.mark.slow) for v in VARIANTS)]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """name -> (folder, fla's float32 model, linstream float32 model, ids, cut), on first use."""
    root = tmp_path_factory.mktemp("fla_cache_models")
    built: dict = {}

    def get(family):
        if family not in built:
            if family == "rwkv7":
                from helpers.rwkv_mamba_models import load_model as load_fla
                from helpers.rwkv_mamba_models import write_model_folder

                folder = write_model_folder(root / family, "rwkv7", "tiny", seed=SEED)
                fla_model = load_fla(folder, "rwkv7")
            elif family == "mamba2":
                from fla.models import Mamba2Config
                from helpers.fla_oracle_mamba2 import MAMBA2_TINY, patch_mamba2_for_cpu

                patch_mamba2_for_cpu()
                folder = build_and_save(family, Mamba2Config(**MAMBA2_TINY), root, seed=SEED)
                fla_model = _fla_from(folder)
            else:
                folder = build_and_save(family, tiny_configs()[family], root, seed=SEED)
                fla_model = _fla_from(folder)
            lin = load_model(folder)
            rng = np.random.default_rng([SEED, [*FAMILIES, *VARIANTS].index(family)])
            ids = rng.integers(0, lin.config.common.vocab_size, T)
            cut = int(rng.integers(5, T - 5))
            print(f"family={family} seed={SEED} cut={cut}")
            built[family] = (folder, fla_model, lin, ids, cut)
        return built[family]

    return get


def _fla_from(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@torch.no_grad()
def fla_run(model, ids, cache=None):
    """fla's hidden states (L + 1 arrays [T, hidden], float32) and its cache after ids (fla's
    Mamba-2 continues one token per call)."""
    x = torch.as_tensor(np.asarray(ids), dtype=torch.long)[None]
    step = 1 if cache is not None and model.config.model_type == "mamba2" else x.shape[1]
    pieces = []
    for a in range(0, x.shape[1], step):
        out = model(
            x[:, a : a + step], past_key_values=cache, use_cache=True, output_hidden_states=True
        )
        cache = out.past_key_values
        pieces.append([h[0].numpy() for h in out.hidden_states])
    return [np.concatenate(p) for p in zip(*pieces, strict=True)], cache


_ERRORS: dict = {}


def errors(folder, fla_model, lin, ids):
    """(fla's float32 whole run, linstream's, e_fla, e_lin): see the module docstring.  Once per
    model folder (the runs are deterministic)."""
    key = str(folder)
    if key not in _ERRORS:
        exact, _ = load_model(folder, compute_dtype=np.float64).hidden_states(ids, None)
        r_fla, _ = fla_run(fla_model, ids)
        r_lin, _ = lin.hidden_states(ids, None)
        _ERRORS[key] = (r_fla, r_lin, worst(r_fla, exact), worst(r_lin, exact))
    return _ERRORS[key]


@pytest.mark.parametrize("family", MODELS)
def test_linstream_prefix_continues_in_fla(zoo, family):
    folder, fla_model, lin, ids, cut = zoo(family)
    r_fla, _, e_fla, e_lin = errors(folder, fla_model, lin, ids)
    _, states = lin.hidden_states(ids[:cut], None)  # float64 states, float32 compute
    cache = to_fla_cache(lin, states, position=cut, dtype=torch.float32)
    assert cache.get_seq_length() == cut
    got, after = fla_run(fla_model, ids[cut:], cache)
    assert after.get_seq_length() == T
    tol = e_fla + FACTOR * max(e_fla, e_lin)
    err = worst(got, [r[cut:] for r in r_fla])
    print(f"error {err:.3g}, tolerance {tol:.3g} (e_fla {e_fla:.3g}, e_lin {e_lin:.3g})")
    assert err <= tol
    fresh, _ = fla_run(fla_model, ids[cut:])
    assert worst(fresh, [r[cut:] for r in r_fla]) > 100 * tol  # the state carries the prefix


@pytest.mark.parametrize("family", MODELS)
def test_fla_prefix_continues_in_linstream(zoo, family):
    folder, fla_model, lin, ids, cut = zoo(family)
    _, r_lin, e_fla, e_lin = errors(folder, fla_model, lin, ids)
    _, cache = fla_run(fla_model, ids[:cut])
    states = from_fla_cache(lin, cache)
    assert all(s.dtype == np.float64 for s in states)
    got, _ = lin.hidden_states(ids[cut:], states)
    tol = e_lin + FACTOR * max(e_fla, e_lin)
    err = worst(got, [r[cut:] for r in r_lin])
    print(f"error {err:.3g}, tolerance {tol:.3g} (e_fla {e_fla:.3g}, e_lin {e_lin:.3g})")
    assert err <= tol
    fresh, _ = lin.hidden_states(ids[cut:], None)
    assert worst(fresh, [r[cut:] for r in r_lin]) > 100 * tol


@pytest.mark.parametrize("family", MODELS)
def test_round_trips_are_exact(zoo, family):
    _, fla_model, lin, ids, cut = zoo(family)
    for dtype in (np.float64, np.float32):
        _, states = lin.hidden_states(ids[:cut], lin.initial_states(dtype))
        back = from_fla_cache(lin, to_fla_cache(lin, states, position=cut), dtype=dtype)
        assert [list(s) for s in back] == [list(s) for s in states]
        for a, b in zip(states, back, strict=True):
            for name in a:
                assert b[name].dtype == a[name].dtype
                np.testing.assert_array_equal(b[name], a[name], err_msg=f"{family} {name}")
    # fla's own cache, through linstream's float64 state and back to float32: the same bits,
    # but the oldest input of each conv tail (no later output reads it; fla's own
    # context-parallel conv sets it to zero too)
    _, cache = fla_run(fla_model, ids[:cut])
    again = to_fla_cache(lin, from_fla_cache(lin, cache), position=cut, dtype=torch.float32)
    assert again.get_seq_length() == cache.get_seq_length() == cut
    for i in range(len(cache)):
        for key, value in cache[i].items():
            mine = again[i][key]
            if value is None:
                assert mine is None, (family, i, key)
                continue
            pairs = zip(value, mine, strict=True) if isinstance(value, tuple) else [(value, mine)]
            for a, b in pairs:
                assert a.dtype == b.dtype == torch.float32
                if key == "conv_state" and a.dim() == 3:
                    torch.testing.assert_close(b[..., 1:], a[..., 1:], rtol=0, atol=0)
                    assert not b[..., 0].any()
                else:
                    torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_every_family_has_a_cache_layout():
    from linstream.ops.model.fla import FAMILIES as ALL

    assert set(FLA_CACHE_FAMILIES) == set(ALL)


def test_a_cache_of_another_model_is_refused_naming_both(zoo):
    _, gla_fla, gla, ids, _ = zoo("gla")
    _, _, delta, _, _ = zoo("delta_net")
    _, cache = fla_run(gla_fla, ids[:9])
    with pytest.raises(ValueError, match="fla cache layer 0 holds recurrent_state") as info:
        from_fla_cache(delta, cache)
    msg = str(info.value)
    assert "\n" not in msg and "delta_net model" in msg and delta.fingerprint[:12] in msg
    assert "[1, 4, 16, 8]" in msg  # the GLA cache's value-major state, named
    one_layer = type(cache).from_legacy_cache((cache[0],), seen_tokens=9)
    with pytest.raises(ValueError, match=r"an fla cache of 1 layers .* whose cache has 2"):
        from_fla_cache(gla, one_layer)
    two = type(cache).from_legacy_cache(
        tuple({k: _repeat(v) for k, v in layer.items()} for layer in cache), seen_tokens=9
    )
    with pytest.raises(ValueError, match="holds \\[2\\] sequences: pass batch_index"):
        from_fla_cache(gla, two)
    picked = from_fla_cache(gla, two, batch_index=1)
    np.testing.assert_array_equal(picked[0]["S"], from_fla_cache(gla, cache)[0]["S"])


def _repeat(v):
    if v is None:
        return None
    if isinstance(v, tuple):
        return tuple(t.repeat(2, *([1] * (t.dim() - 1))) for t in v)
    return v.repeat(2, *([1] * (v.dim() - 1)))


def test_position_is_required_where_the_state_does_not_carry_it(zoo):
    _, _, gla, ids, _ = zoo("gla")
    _, states = gla.hidden_states(ids[:7], None)
    with pytest.raises(ValueError, match="gla state does not carry its position; pass position"):
        to_fla_cache(gla, states)
    _, _, retnet, ids, _ = zoo("retnet")
    _, states = retnet.hidden_states(ids[:7], None)
    assert to_fla_cache(retnet, states).get_seq_length() == 7  # RetNet's layers carry it
    with pytest.raises(ValueError, match="the states carry position \\[7\\], the sequence is at 8"):
        to_fla_cache(retnet, states, position=8)


def test_without_fla_one_line(zoo, monkeypatch):
    _, _, gla, ids, _ = zoo("gla")
    _, states = gla.hidden_states(ids[:3], None)
    monkeypatch.setitem(sys.modules, "fla.models.utils", None)
    with pytest.raises(ImportError, match="needs flash-linear-attention") as info:
        to_fla_cache(gla, states, position=3)
    assert "\n" not in str(info.value)


def test_the_oracle_is_patched():
    assert patch_fla_for_cpu()  # fla's Triton launches would raise: the CPU references run


@pytest.mark.parametrize(
    "family", ["gla", *(pytest.param(f, marks=pytest.mark.slow) for f in ("rwkv7", "mamba2"))]
)
def test_a_checkpointed_sequence_continues_in_fla(zoo, family, tmp_path):
    """The user's path: the embed stage commits a sequence's state (CPU workers, float64 state);
    `linstream state export` writes it to a file, and the file's state continues in fla as the
    whole sequence would have (tolerance as in test_linstream_prefix_continues_in_fla)."""
    from helpers.cli import linstream
    from helpers.stage_runs import run_stage
    from linstream.pipeline import Chunk, EmbedSequences
    from linstream.state.exchange import read_state_file

    folder, fla_model, lin, ids, cut = zoo(family)
    r_fla, _, e_fla, e_lin = errors(folder, fla_model, lin, ids)
    bounds = [0, cut // 3, cut]
    chunks = [
        Chunk("s", i, ids[a:b].astype(np.int32), final=False)
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    ckpt = str(tmp_path / "ckpt")
    run = run_stage(chunks, EmbedSequences(str(folder), checkpoint_dir=ckpt, checkpoint_every=1))
    assert not run.dead, run.dead
    out = tmp_path / "s.safetensors"
    done = linstream("state", "export", ckpt, "--seq", "s", "--out", str(out))
    assert done.returncode == 0, done.stderr
    st = read_state_file(str(out))
    assert st.position == cut and st.dtype == np.float64 and st.fingerprint == lin.fingerprint
    states = lin.unstack_states(st.tensors, st.position)
    cache = to_fla_cache(lin, states, position=st.position, dtype=torch.float32)
    got, _ = fla_run(fla_model, ids[cut:], cache)
    tol = e_fla + FACTOR * max(e_fla, e_lin)
    err = worst(got, [r[cut:] for r in r_fla])
    print(f"error {err:.3g}, tolerance {tol:.3g} (e_fla {e_fla:.3g}, e_lin {e_lin:.3g})")
    assert err <= tol
