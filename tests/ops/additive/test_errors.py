"""Bad input gets a clear error (expected vs received); T=0, eps=0 and inputs left untouched."""

import numpy as np
import pytest
from helpers.ops_inputs import BACKENDS, make_qkv
from linstream.ops import AttentionState, causal_linear_attention, linear_attention


def _qkv(t=5, h=2, dk=3, dv=4, dtype=np.float64):
    return make_qkv(np.random.default_rng(0), t, h, dk, dv, dtype=dtype)


BAD_SHAPES = {
    "T-mismatch": (lambda q, k, v: (q, k[:4], v), ValueError, "same shape"),
    "H-mismatch-v": (lambda q, k, v: (q, k, v[:, :1]), ValueError, "v must be"),
    "dk-mismatch": (lambda q, k, v: (q, k[:, :, :2], v), ValueError, "same shape"),
    "T-mismatch-v": (lambda q, k, v: (q, k, v[:3]), ValueError, "v must be"),
    "2-D": (lambda q, k, v: (q[:, 0], k[:, 0], v[:, 0]), ValueError, "3-D"),
    "4-D": (lambda q, k, v: (q[None], k[None], v[None]), ValueError, "3-D"),
    "int-dtype": (lambda q, k, v: (q.astype(np.int64), k, v), TypeError, "floating"),
    "complex-dtype": (lambda q, k, v: (q, k, v.astype(np.complex128)), TypeError, "floating"),
    "list-input": (lambda q, k, v: (q.tolist(), k, v), TypeError, "array"),
}


@pytest.mark.parametrize("case", list(BAD_SHAPES), ids=list(BAD_SHAPES))
@pytest.mark.parametrize("fn", ["causal", "noncausal"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs_raise(backend, fn, case):
    make, exc, match = BAD_SHAPES[case]
    q, k, v = make(*_qkv())
    with pytest.raises(exc, match=match):
        if fn == "causal":
            causal_linear_attention(q, k, v, backend=backend)
        else:
            linear_attention(q, k, v, backend=backend)


@pytest.mark.parametrize(
    "state",
    [
        AttentionState.zeros(3, 3, 4),
        AttentionState.zeros(2, 4, 4),
        AttentionState(np.zeros((2, 3, 4)), np.zeros((2, 4))),
    ],
    ids=["wrong-heads", "wrong-dk", "wrong-z"],
)
def test_wrong_state_shape_raises(state):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"state shapes must be S \(2, 3, 4\)"):
        causal_linear_attention(q, k, v, state)


def test_wrong_state_type_and_dtype_raise():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="AttentionState"):
        causal_linear_attention(q, k, v, (np.zeros((2, 3, 4)), np.zeros((2, 3))))
    bad = AttentionState(np.zeros((2, 3, 4), np.int64), np.zeros((2, 3), np.int64))
    with pytest.raises(TypeError, match="floating"):
        causal_linear_attention(q, k, v, bad)
    with pytest.raises(TypeError, match="state_dtype"):
        causal_linear_attention(q, k, v, state_dtype=np.int32)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps": -1.0}, "eps"),
        ({"eps": float("nan")}, "eps"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"backend": "tpu"}, "unknown backend"),
    ],
    ids=["negative-eps", "nan-eps", "zero-chunk", "unknown-backend"],
)
def test_bad_options_raise(kwargs, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        causal_linear_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_input_returns_empty_output_and_the_state_unchanged(backend):
    q, k, v = _qkv(t=0, dtype=np.float32)
    s0 = AttentionState(np.ones((2, 3, 4)), np.ones((2, 3)))
    out, st = causal_linear_attention(q, k, v, s0, backend=backend)
    assert out.shape == (0, 2, 4) and out.dtype == np.float32
    np.testing.assert_array_equal(st.S, s0.S)
    np.testing.assert_array_equal(st.z, s0.z)
    assert st.S is not s0.S  # a copy: the caller may keep and change its own


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("feature_map", ["elu+1", "relu", "favor+"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_and_state_are_not_mutated(backend, feature_map, dtype):
    q, k, v = _qkv(t=40, dtype=dtype)
    q[0] = -3.0  # negative entries: an in-place φ would change them
    s0 = AttentionState(np.ones((2, 3, 4)), np.ones((2, 3)))
    if feature_map == "favor+":
        s0 = AttentionState(np.ones((2, 3, 4)), np.ones((2, 3)))
    copies = [x.copy() for x in (q, k, v, s0.S, s0.z)]
    _, st = causal_linear_attention(q, k, v, s0, feature_map=feature_map, backend=backend)
    for before, after in zip(copies, (q, k, v, s0.S, s0.z), strict=True):
        np.testing.assert_array_equal(before, after)
    assert not np.shares_memory(st.S, s0.S)
    linear_attention(q, k, v, feature_map=feature_map, backend=backend)
    for before, after in zip(copies, (q, k, v), strict=False):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_and_mixed_inputs(backend):
    """Strided views and a float32/float64 mix are accepted (computed in float64)."""
    rng = np.random.default_rng(2)
    big = rng.standard_normal((30, 4, 6))
    q, k = big[::2, ::2, :3], big[::2, 1::2, 3:]
    v = big[::2, ::2, ::2].astype(np.float32)
    out, _ = causal_linear_attention(q, k, v, backend=backend)
    ref, _ = causal_linear_attention(
        np.ascontiguousarray(q), np.ascontiguousarray(k), v.astype(np.float64), backend="numpy"
    )
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
