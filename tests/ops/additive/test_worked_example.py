"""The first article's worked example: keys [1,0],[0,1],[1,0]; values [2,0],[0,3],[1,1]."""

import numpy as np
import pytest
from helpers.ops_inputs import BACKENDS
from linstream.ops import causal_linear_attention
from linstream.ops.additive.naive import causal_quadratic, causal_recurrent

KEYS = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])[:, None, :]
VALUES = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0]])[:, None, :]
EXPECTED_OUT = np.array([[2.0, 0.0], [0.0, 3.0], [1.5, 0.5]])
EXPECTED_S = np.array([[3.0, 1.0], [0.0, 3.0]])
EXPECTED_Z = np.array([2.0, 1.0])


@pytest.mark.parametrize("fn", [causal_quadratic, causal_recurrent], ids=["quadratic", "recurrent"])
def test_references_reproduce_worked_example(fn):
    out, st = fn(KEYS, KEYS, VALUES, feature_map="identity", eps=0.0)
    np.testing.assert_allclose(out[:, 0], EXPECTED_OUT, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st.S[0], EXPECTED_S, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st.z[0], EXPECTED_Z, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("chunk_size", [1, 2, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_reproduces_worked_example(backend, chunk_size, dtype):
    out, st = causal_linear_attention(
        KEYS.astype(dtype),
        KEYS.astype(dtype),
        VALUES.astype(dtype),
        feature_map="identity",
        eps=0.0,
        backend=backend,
        chunk_size=chunk_size,
    )
    assert out.dtype == dtype
    np.testing.assert_allclose(out[:, 0], EXPECTED_OUT, rtol=0, atol=1e-6)
    np.testing.assert_allclose(st.S[0], EXPECTED_S, rtol=0, atol=1e-12)
    np.testing.assert_allclose(st.z[0], EXPECTED_Z, rtol=0, atol=1e-12)
    assert st.S.dtype == np.float64  # the state is float64 by default, whatever the inputs
