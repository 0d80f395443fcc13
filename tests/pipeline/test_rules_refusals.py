"""`CausalLinearAttention(rule=...)` refuses what it cannot apply: bad transform arguments at
construction, bad per-token inputs as dead letters (the job and the other sequences go on), and a
resume under another rule or other parameters (`restore_failed`, naming both).  The additive
rule's fingerprint is the one stores written before the rules existed hold."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.rules import reference
from helpers.stage_runs import run_stage
from linstream.pipeline import CausalLinearAttention, Chunk
from linstream.pipeline.stage.steps import BadInput, RawAttentionStep
from linstream.state import CheckpointStore

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

# Fingerprints of the additive step as written into checkpoints before `rule=` existed (computed
# with the step of that version): changing them would orphan every existing store.
ADDITIVE_FINGERPRINTS = [
    ({}, "4971dbb5b76edd6cb3f36dcb669f1855d2440b50d6831c6847d144dbf274a798"),
    (
        {"feature_map": "relu", "eps": 0.0},
        "4191f9bb1f7842b7358a086e88ead16ea2b9843c9534168e9ed255d263ed2d75",
    ),
    (
        {"feature_map": {"name": "favor+", "num_features": 8, "seed": 3}, "eps": 1e-3},
        "09f43215deefb5619af011ad8cd250eed4f9d87fa71cc66f6cb0901491cfd244",
    ),
]


@pytest.mark.parametrize("kw,expected", ADDITIVE_FINGERPRINTS, ids=["default", "relu", "favor+"])
def test_the_additive_fingerprint_is_unchanged(kw, expected):
    assert RawAttentionStep(**kw).fingerprint == expected
    assert RawAttentionStep(**kw, rule="additive", normalize=True).fingerprint == expected


def test_every_rule_and_parameter_has_its_own_fingerprint():
    steps = [
        {},
        {"rule": "decay", "gamma": 0.9},
        {"rule": "decay", "gamma": 0.8},
        {"rule": "decay", "gamma": [0.9, 0.8]},
        {"rule": "decay", "gamma": 0.9, "normalize": False},
        {"rule": "gated"},
        {"rule": "gated", "normalize": False},
        {"rule": "delta"},
        {"rule": "gated_delta"},
        {"rule": "gated", "eps": 0.0},
        {"rule": "gated", "feature_map": "relu"},
    ]
    prints = [RawAttentionStep(**kw).fingerprint for kw in steps]
    assert len(set(prints)) == len(steps)
    # the same arguments give the same fingerprint (a resume finds its checkpoints)
    assert RawAttentionStep(rule="decay", gamma=0.9).fingerprint == prints[1]


@pytest.mark.parametrize(
    "kw,words",
    [
        ({"rule": "softmax"}, "rule must be one of"),
        ({"rule": "decay"}, "rule 'decay' needs gamma"),
        ({"rule": "decay", "gamma": 1.0}, "gamma must lie in (0, 1) for every head, got 1.0"),
        ({"rule": "decay", "gamma": [0.5, float("nan")]}, "got nan for head 1"),
        ({"rule": "decay", "gamma": [[0.5]]}, "gamma must be a number or a list [H]"),
        ({"rule": "decay", "gamma": "x"}, "gamma must be a real number"),
        (
            {"rule": "gated", "gamma": 0.5},
            "gamma is an argument of rule 'decay', not of rule 'gated'",
        ),
        ({"rule": "delta", "normalize": False}, "normalize=False is for rules ['decay', 'gated']"),
        ({"normalize": False}, "got rule 'additive'"),
        ({"rule": "gated", "normalize": 1}, "normalize must be True or False, got 1"),
        ({"rule": "gated", "backend": "numpy"}, "expected backend 'auto' or 'numba'"),
    ],
)
def test_bad_transform_arguments_fail_at_construction_with_one_line(kw, words):
    with pytest.raises(ValueError) as info:
        CausalLinearAttention(**kw)
    text = str(info.value)
    assert text.startswith("CausalLinearAttention: ") and words in text
    assert "\n" not in text


def _payload(rule: str, t: int = 5, h: int = 2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {n: rng.standard_normal((t, h, 3)).astype(np.float32) for n in "qkv"}
    if rule in ("gated", "gated_delta"):
        data["log_alpha"] = -rng.uniform(0.0, 1.0, size=(t, h))
    if rule in ("delta", "gated_delta"):
        data["beta"] = rng.uniform(0.1, 1.0, size=(t, h))
    return data


def _with(data: dict, **changes) -> dict:
    out = {k: v for k, v in data.items() if k not in changes}
    out.update({k: v for k, v in changes.items() if v is not None})
    return out


def _bad(data: dict, row: int, col: int, value: float, name: str) -> np.ndarray:
    a = np.array(data[name])
    a[row, col] = value
    return a


GATED, DELTA = _payload("gated"), _payload("delta")
BAD_INPUTS = {
    "gated: no log_alpha": (
        "gated", _with(GATED, log_alpha=None), "bad_payload",
        ['missing [\'log_alpha\']', "per-token inputs of rule 'gated'", '"log_alpha" [T, H]'],
    ),
    "gated: a beta it does not use": (
        "gated", _with(GATED, beta=np.full((5, 2), 0.5)), "bad_payload",
        ["unexpected ['beta']", "rule 'gated'"],
    ),
    "additive: a log_alpha it does not use": (
        "additive", _with(GATED), "bad_payload",
        ["unexpected ['log_alpha']", "per-token inputs of rule 'additive': none"],
    ),
    "gated: log_alpha [T, H+1]": (
        "gated", _with(GATED, log_alpha=np.zeros((5, 3))), "bad_shape",
        ["log_alpha: expected [T, H] = [5, 2]", "got shape [5, 3]"],
    ),
    "gated: log_alpha [T]": (
        "gated", _with(GATED, log_alpha=np.zeros(5)), "bad_shape",
        ["log_alpha: expected [T, H] = [5, 2]", "got shape [5]"],
    ),
    "gated: log_alpha > 0": (
        "gated", _with(GATED, log_alpha=_bad(GATED, 3, 1, 0.25, "log_alpha")), "invalid_input",
        ["log_alpha: expected finite log gates <= 0", "got 0.25 at token 3, head 1"],
    ),
    "gated: log_alpha NaN": (
        "gated", _with(GATED, log_alpha=_bad(GATED, 2, 0, np.nan, "log_alpha")), "non_finite",
        ["log_alpha: expected finite values", "token(s) [2]"],
    ),
    "gated: log_alpha -inf": (
        "gated", _with(GATED, log_alpha=_bad(GATED, 4, 0, -np.inf, "log_alpha")), "non_finite",
        ["log_alpha: expected finite values", "token(s) [4]"],
    ),
    "gated: log_alpha as text": (
        "gated", _with(GATED, log_alpha=np.array(["a"] * 10).reshape(5, 2)), "bad_dtype",
        ["log_alpha: expected a real array [T, H] = [5, 2]", "dtype <U1"],
    ),
    "gated: log_alpha as booleans": (
        "gated", _with(GATED, log_alpha=np.zeros((5, 2), bool)), "bad_dtype",
        ["log_alpha: expected a real array", "dtype bool"],
    ),
    "delta: beta = 0": (
        "delta", _with(DELTA, beta=_bad(DELTA, 0, 1, 0.0, "beta")), "invalid_input",
        ["beta: expected finite step sizes in (0, 1]", "got 0.0 at token 0, head 1"],
    ),
    "delta: beta > 1": (
        "delta", _with(DELTA, beta=_bad(DELTA, 1, 0, 1.5, "beta")), "invalid_input",
        ["got 1.5 at token 1, head 0 (1 value(s) out of range)"],
    ),
    "delta: beta for another T": (
        "delta", _with(DELTA, beta=np.ones((4, 2))), "bad_shape",
        ["beta: expected [T, H] = [5, 2]", "got shape [4, 2]"],
    ),
    "decay: gamma for 3 heads, chunk of 2": (
        ("decay", [0.5, 0.6, 0.7]), _payload("decay"), "bad_shape",
        ["expected H = 3 heads", "got q [5, 2, 3]"],
    ),
}  # fmt: skip


def _step(rule) -> RawAttentionStep:
    if isinstance(rule, tuple):
        return RawAttentionStep(rule=rule[0], gamma=rule[1])
    return RawAttentionStep(rule=rule)


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_per_token_inputs_are_refused_naming_what_was_expected(case):
    rule, data, reason, words = BAD_INPUTS[case]
    with pytest.raises(BadInput) as info:
        _step(rule).validate(data)
    assert info.value.reason == reason
    for w in words:
        assert w in info.value.message
    assert "\n" not in info.value.message


def test_integer_betas_are_accepted():
    step = RawAttentionStep(rule="delta")
    data = _with(DELTA, beta=np.ones((5, 2), np.int64))
    assert step.validate(data)["beta"].dtype == np.int64


@pytest.mark.parametrize("rule", ["gated", "delta"])
def test_bad_chunks_go_to_the_dead_letters_and_the_sequence_goes_on(rule):
    """Each bad variant of chunk 1 is dead-lettered with the sequence and chunk named; the good
    chunk 1 sent as well is applied, so every sequence ends as the reference of its good chunks
    (the bad ones changed no state), and a sequence of good chunks only is untouched."""
    cases = {k: v for k, v in BAD_INPUTS.items() if v[0] == rule}
    seed = 21 if rule == "gated" else 22
    print(f"seed={seed} rule={rule}")
    rng = np.random.default_rng(seed)
    good = {}
    chunks = []
    for n, case in enumerate([*cases, "clean"]):
        sid = f"seq-{n}"
        seeds = [seed * 100 + 10 * n + i for i in range(3)]
        parts = [_payload(rule, t=int(rng.integers(2, 8)), seed=s) for s in seeds]
        # the bad variant keeps the good chunk's T (= 5) so that only its gate or β is wrong
        parts[1] = _payload(rule, seed=seeds[1])
        good[sid] = parts
        chunks += [Chunk(sid, i, p, final=i == 2) for i, p in enumerate(parts)]
        if case != "clean":
            chunks.append(Chunk(sid, 1, cases[case][1]))
    # a resent chunk whose gate or β differs from the applied one is a conflicting duplicate
    first = _payload(rule, seed=seed)
    name = "log_alpha" if rule == "gated" else "beta"
    chunks += [Chunk("resent", 0, first), Chunk("resent", 0, {**first, name: first[name] / 2})]
    chunks = [chunks[int(i)] for i in rng.permutation(len(chunks))]
    run = run_stage(chunks, CausalLinearAttention(rule=rule))
    conflicts = [d for d in run.dead if d.seq_id == "resent"]
    assert [(d.chunk_index, d.reason) for d in conflicts] == [(0, "conflicting_duplicate")]
    assert [r.seq_id for r in run.results].count("resent") == 1
    dead = {d.seq_id: d for d in run.dead if d.seq_id != "resent"}
    assert len(dead) == len(run.dead) - 1 == len(cases)
    assert set(dead) == {f"seq-{n}" for n in range(len(cases))}
    for n, case in enumerate(cases):
        d = dead[f"seq-{n}"]
        assert (d.chunk_index, d.reason) == (1, cases[case][2]), (case, d)
        assert d.message.startswith(f"sequence 'seq-{n}', chunk 1: "), d.message
        for w in cases[case][3]:
            assert w in d.message
    for sid, parts in good.items():  # "resent" is not among them
        data = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        ref, tol = reference(rule, {}, data, len(parts))
        got = np.concatenate([r.output for r in run.results if r.seq_id == sid])
        assert got.shape == ref.shape and np.max(np.abs(got - ref)) <= tol


RESUMES = {
    "gated then delta": (
        ("gated", {}), ("delta", {}), "rule 'gated' (normalize True)", "rule 'delta'",
    ),
    "additive then decay": (
        ("additive", {}), ("decay", {"gamma": 0.9}), "rule 'additive'",
        "rule 'decay' (gamma 0.9, normalize True)",
    ),
    "decay 0.9 then decay 0.8": (
        ("decay", {"gamma": 0.9}), ("decay", {"gamma": 0.8}),
        "rule 'decay' (gamma 0.9, normalize True)", "rule 'decay' (gamma 0.8, normalize True)",
    ),
    "gated then gated unnormalized": (
        ("gated", {}), ("gated", {"normalize": False}),
        "rule 'gated' (normalize True)", "rule 'gated' (normalize False)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(RESUMES))
def test_a_resume_under_another_rule_is_refused_naming_both(case, tmp_path):
    (rule1, args1), (rule2, args2), before, after = RESUMES[case]
    ckpt = str(tmp_path / "ckpt")
    first = [Chunk("old", 0, _payload(rule1, seed=1))]
    t1 = CausalLinearAttention(rule=rule1, checkpoint_dir=ckpt, **args1)
    r1 = run_stage(first, t1)
    assert r1.dead == [] and len(r1.results) == 1
    store = CheckpointStore(ckpt)
    committed = store.restore("old", fingerprint=RawAttentionStep(rule=rule1, **args1).fingerprint)
    assert committed is not None and committed.next_chunk == 1
    second = [Chunk("old", 1, _payload(rule2, seed=2)), Chunk("old", 2, _payload(rule2, seed=3))]
    fresh = [Chunk("new", 0, _payload(rule2, seed=4), final=True)]
    t2 = CausalLinearAttention(rule=rule2, checkpoint_dir=ckpt, resume=True, **args2)
    r2 = run_stage(second + fresh, t2)
    assert sorted((d.seq_id, d.chunk_index, d.reason) for d in r2.dead) == [
        ("old", 1, "restore_failed"),
        ("old", 2, "restore_failed"),
    ]
    for d in r2.dead:
        msg = d.message
        assert "\n" not in msg
        assert f"the checkpoint was written under {before}, this job runs {after}" in msg, msg
    # the other sequence runs under the new rule; the refused one's checkpoint is unchanged
    assert [r.seq_id for r in r2.results] == ["new"]
    again = store.restore("old", fingerprint=RawAttentionStep(rule=rule1, **args1).fingerprint)
    assert again is not None and again.next_chunk == 1
    assert again.S.tobytes() == committed.S.tobytes()


def test_the_refusal_names_what_the_fingerprints_tell_apart():
    from linstream.state import CorruptCheckpointError, ModelMismatchError

    step = RawAttentionStep(rule="gated")

    def message(found: str) -> str:
        ex = ModelMismatchError("state of another model", expected=step.fingerprint, found=found)
        return step.restore_message(ex.at("ckpt/s/1.arrow"))

    other_eps = RawAttentionStep(rule="gated", eps=0.0).fingerprint
    assert "written under rule 'gated' (normalize True) with another feature map or eps, this " \
        "job runs rule 'gated' (normalize True)" in message(other_eps)  # fmt: skip
    relu = RawAttentionStep(feature_map="relu").fingerprint
    assert "written under another feature map, eps or model (fingerprint " in message(relu)
    assert message(relu).startswith("ckpt/s/1.arrow: state of another model; ")
    corrupt = CorruptCheckpointError("truncated", path="ckpt/s/1.arrow")
    assert step.restore_message(corrupt) == "ckpt/s/1.arrow: truncated"
