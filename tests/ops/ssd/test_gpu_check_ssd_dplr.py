"""tests/gpu/gpu_check_ssd_dplr.py's failure lines: a Numba output that disagrees (one value
changed in the prepared file, as the device machine reads it) fails that case, in one line naming
the rule, the kernel and the error (the script as a whole runs in its dry run in
tests/ops/additive/test_cupy_backend.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.cuda_emu import EmuLauncher, compiler_missing

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))
pytest.importorskip("torch")
pytest.importorskip("transformers", reason="transformers is a test extra (make test installs it)")

GPU = Path(__file__).resolve().parents[2] / "gpu"


def _module():
    """tests/gpu/gpu_check_ssd_dplr.py, loaded from its file (tests/gpu is not a package); it
    imports gpu_check_rules from its folder, as gpu_check.py's run does."""
    for name in ("gpu_check_rules", "gpu_check_ssd_dplr"):
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
            assert spec is not None and spec.loader is not None
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
    return sys.modules["gpu_check_ssd_dplr"]


CASES = [("ssd1.numba_y", "ssd", "ssd_chunks"), ("dplr.numba_out", "dplr", "dplr_chunks")]


@pytest.mark.parametrize(("key", "rule", "kernel"), CASES)
def test_a_disagreeing_numba_output_fails_in_one_line(
    tmp_path, monkeypatch, capsys, key, rule, kernel
):
    from linstream.ops.dplr.cupy import dplr_chunks
    from linstream.ops.ssd.cupy import ssd_chunks

    mod = _module()
    path = tmp_path / "ssd_dplr_refs.npz"
    mod.prepare(str(path), dry_run=True)
    arrays = dict(np.load(path))
    arrays[key][10, 1, 3] += 0.5
    np.savez(path, **arrays)
    monkeypatch.setenv("GPU_CHECK_NO_NUMBA", "1")
    lau = EmuLauncher(1)
    rows = mod._against_numba(
        lambda *a, **k: ssd_chunks(*a, **k, launcher=lau),
        lambda *a, **k: dplr_chunks(*a, **k, launcher=lau),
        True,
        np.load(path),
        str(path),
    )
    assert [r["rule"] for r in rows if not r["ok"]] == [rule]
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  FAIL"))
    assert rule in line and kernel in line and "5.00e-01" in line, line
