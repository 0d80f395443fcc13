"""Backend choice around CuPy, and the GPU entry points' behaviour on a machine without a device.

The device is faked by replacing `cupy_unavailable_reason` (None = usable), so every branch runs
on the CPU; the real no-device answers are checked where this machine has no GPU.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from linstream.ops import backend
from linstream.ops.attention_state import AttentionState
from linstream.ops.backend import BackendUnavailableError, resolve_backend

ROOT = Path(__file__).resolve().parents[3]
NO_GPU = "cupy is installed but sees no usable CUDA device (cupy.is_available() is False)"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(backend, "cupy_unavailable_reason", lambda: NO_GPU)
    monkeypatch.delenv(backend.ENV_VAR, raising=False)


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(backend, "cupy_unavailable_reason", lambda: None)
    monkeypatch.delenv(backend.ENV_VAR, raising=False)


def _cpu() -> str:
    return "numba" if backend.numba_available() else "numpy"


def test_auto_picks_cupy_when_a_device_is_usable(fake_gpu):
    assert resolve_backend("auto") == "cupy"


def test_auto_picks_a_cpu_backend_without_a_device(no_gpu):
    assert resolve_backend("auto") == _cpu()


@pytest.mark.parametrize("env", ["numpy", "NumPy", " numpy "])
def test_environment_variable_overrides_auto(fake_gpu, monkeypatch, env):
    monkeypatch.setenv(backend.ENV_VAR, env)
    assert resolve_backend("auto") == "numpy"


def test_environment_variable_auto_or_empty_means_auto(fake_gpu, monkeypatch):
    for env in ("auto", ""):
        monkeypatch.setenv(backend.ENV_VAR, env)
        assert resolve_backend("auto") == "cupy"


def test_explicit_argument_wins_over_the_environment(fake_gpu, monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "numpy")
    assert resolve_backend("cupy") == "cupy"


def test_cupy_without_a_device_raises_a_clear_error(no_gpu):
    with pytest.raises(BackendUnavailableError, match="cupy") as ei:
        resolve_backend("cupy")
    assert NO_GPU in str(ei.value) and "backend argument" in str(ei.value)


def test_cupy_from_the_environment_without_a_device_names_the_variable(no_gpu, monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "cupy")
    with pytest.raises(BackendUnavailableError, match=backend.ENV_VAR):
        resolve_backend("auto")


def test_unknown_name_in_the_environment_is_a_value_error(no_gpu, monkeypatch):
    monkeypatch.setenv(backend.ENV_VAR, "tpu")
    with pytest.raises(ValueError, match=f"'tpu'.*{backend.ENV_VAR}"):
        resolve_backend("auto")


def test_unknown_name_is_a_value_error(no_gpu):
    with pytest.raises(ValueError, match="expected 'auto' or one of"):
        resolve_backend("gpu")


def test_fallback_when_allowed_logs_a_warning(no_gpu, caplog):
    with caplog.at_level(logging.WARNING, logger=backend.log.name):
        got = resolve_backend("cupy", allow_fallback=True)
    assert got == _cpu()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "falling back" in warnings[0].getMessage() and NO_GPU in warnings[0].getMessage()


def test_no_warning_when_cupy_runs(fake_gpu, caplog):
    with caplog.at_level(logging.WARNING, logger=backend.log.name):
        assert resolve_backend("cupy", allow_fallback=True) == "cupy"
    assert not caplog.records


def test_the_real_reason_is_a_string_or_none():
    reason = backend.cupy_unavailable_reason()
    assert reason is None or "cupy" in reason
    assert backend.cupy_available() is (reason is None)


needs_no_gpu = pytest.mark.skipif(
    backend.cupy_available(), reason="checks the no-device answers; this machine has a GPU"
)


@needs_no_gpu
def test_cupy_entry_points_raise_without_a_device():
    from linstream.ops.additive.cupy import cupy_causal, xp_cupy

    with pytest.raises(BackendUnavailableError, match="cupy backend cannot run here"):
        xp_cupy()
    x = np.zeros((4, 1, 2), np.float32)
    with pytest.raises(BackendUnavailableError):
        cupy_causal(x, x, x, AttentionState.zeros(1, 2, 2))


@needs_no_gpu
def test_gpu_check_exits_cleanly_without_a_device(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "gpu" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no usable CUDA device" in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "skipped" and "cupy" in report["reason"]


def test_gpu_check_logic_runs_on_the_cpu_in_its_dry_run(tmp_path):
    """The script's own code (correctness loops, rivals, tables, JSON) with NumPy for CuPy and
    the rule kernels on the CPU emulator; the Numba comparison from a file prepared first, as
    on the device machine (which has no Numba)."""
    script = str(ROOT / "tests" / "gpu" / "gpu_check.py")
    refs = tmp_path / "numba_rules.npz"
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_CPU_DRYRUN": "1", "GPU_CHECK_SEED": "7",
           "GPU_CHECK_NUMBA_REFS": str(refs), "GPU_CHECK_NO_NUMBA": "1"}  # fmt: skip
    prep = subprocess.run(
        [sys.executable, script, "--prepare-numba", str(refs)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )  # fmt: skip
    assert prep.returncode == 0 and refs.exists(), prep.stdout + prep.stderr
    proc = subprocess.run(
        [sys.executable, script], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "ok"
    assert all(case["ok"] for case in report["correctness"]["cases"])
    impls = {(r["impl"], r["dtype"]) for r in report["throughput"] if "ms" in r}
    assert ("linstream cupy (device arrays)", "bfloat16") in impls
    assert ("pytorch chunked (same form, fp32 matmuls)", "float32") in impls
    assert "| implementation |" in proc.stdout
    rule_cases = report["rules_correctness"]["cases"]
    assert all(case["ok"] for case in rule_cases)
    checks = collections.Counter((c["check"], c["rule"]) for c in rule_cases)
    for rule in ("decay", "gated", "gated-unnormalized", "vector", "delta", "gated_delta"):
        assert checks["reference", rule] >= 1 and checks["numba", rule] == 1, checks
    assert all(str(refs) in c["source"] for c in rule_cases if c["check"] == "numba")
    rows = {(r["rule"], r["impl"], r["dtype"]) for r in report["rules_throughput"]["rows"]}
    assert ("gated_delta", "linstream delta_chunks", "bfloat16") in rows
    assert ("vector", "linstream vector_gated_chunks", "float32") in rows
    assert "| rule | implementation |" in proc.stdout
    sd_cases = report["ssd_dplr_correctness"]["cases"]  # Mamba-2's SSD, RWKV-7's DPLR
    assert all(case["ok"] for case in sd_cases) and "skipped" not in str(sd_cases)
    assert sum(c.get("check") == "numba" for c in sd_cases) == 3
    sd_rows = {(r["rule"], r["impl"], r["dtype"]) for r in report["ssd_dplr_throughput"]["rows"]}
    assert ("ssd", "linstream ssd_chunks", "bfloat16") in sd_rows
    assert ("dplr", "linstream dplr_chunks", "float32") in sd_rows


def _gpu_check_rules():
    """tests/gpu/gpu_check_rules.py, loaded from its file (tests/gpu is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "gpu_check_rules", ROOT / "tests" / "gpu" / "gpu_check_rules.py"
    )
    assert spec is not None and spec.loader is not None
    rules = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rules)
    return rules


def test_gpu_check_names_the_rule_kernel_and_error_of_a_failure(tmp_path, monkeypatch, capsys):
    """A Numba output that disagrees (one value changed in the prepared file) fails that case,
    in one line naming the rule, the kernel and the error."""
    from helpers.cuda_emu import EmuLauncher, compiler_missing

    if compiler_missing() is not None:
        pytest.skip(str(compiler_missing()))
    rules = _gpu_check_rules()
    path = tmp_path / "numba_rules.npz"
    rules.prepare_numba(str(path), dry_run=True)
    arrays = dict(np.load(path))
    arrays["4.out"][10, 1, 3] += 0.5  # case 4: the delta rule
    np.savez(path, **arrays)
    monkeypatch.setenv("GPU_CHECK_NO_NUMBA", "1")
    rows = rules._against_numba(EmuLauncher(1), True, str(path))
    assert [r["ok"] for r in rows] == [True, True, True, True, False, True]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  FAIL"))
    assert "delta" in line and "delta_chunks" in line and "out 5.00e-01" in line, line


def test_gpu_check_calls_fla_with_arguments_its_kernels_take():
    """The rivals' calls, bound to fla's own signatures on the CPU (its kernels need a device):
    the names and shapes the device run will pass."""
    import inspect

    import fla.ops
    import torch
    from helpers import rule_kernels as rk

    rules = _gpu_check_rules()
    for rule in rules.FLA_OF:
        case = rk.make_case(rule, 1, 20, 3, 8, 5)
        x = rk.kernel_inputs(case, 0, 20, np.float32)
        s0 = rk.initial_state(case, np.float64)
        name, args, kw = rules.fla_arguments(rule, x, s0, torch, torch.bfloat16, device="cpu")
        inspect.signature(getattr(fla.ops, name)).bind(*args, **kw)
        q, k, v = args
        assert q.shape == k.shape == (1, 20, 3, 8) and v.shape == (1, 20, 3, 5), rule
        assert kw["initial_state"].shape == (1, 3, 8, 5), rule
        gate = kw.get("g", kw.get("g_gamma"))
        want = {"decay": (3,), "vector": (1, 20, 3, 8)}.get(rule, (1, 20, 3))
        assert (gate is None) == (rule == "delta") and (gate is None or gate.shape == want), rule
