"""The one device check (tests/gpu/gpu_check_all.py): its CPU dry run end to end (slow), and the
"cupy vs fla forward" bound, which must not grow with fla's own error."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
FAMILIES = ["gla", "retnet", "hgrn2", "delta_net", "gated_deltanet", "rwkv7", "mamba2"]


def _load(name: str) -> ModuleType:
    """A script of tests/gpu, loaded from its file (tests/gpu is not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class _FarFla:
    """fla's forward as gpu_check_fla.Fla offers it, returning the reference plus `off`."""

    def __init__(self, ref: np.ndarray, off: float) -> None:
        self.ref, self.off = ref, off
        self.torch = SimpleNamespace(float32="float32")

    def load(self, folder: Path, dtype: str, **config: str) -> str:
        return "model"

    def hidden(self, model: str, ids: np.ndarray, piece: int = 0) -> np.ndarray:
        return self.ref + self.off

    @property
    def float32_oracle(self):  # the real method, over this stub's load and hidden
        return _load("gpu_check_fla").Fla.float32_oracle.__get__(self)


@pytest.mark.parametrize(("off", "ok"), [(5.35, False), (2e-6, True)])
def test_cupy_vs_fla_fails_when_fla_alone_is_far_off(off, ok):
    """A float32 fla forward 5.35 from the float64 run fails the comparison (the bound before
    grew with fla's own error: 8 x max(1e-6, 5.35) let it pass); one within linstream's float32
    error passes.  linstream's device output is 1e-6 off, the CPU float32 run's error 1e-6, so
    the bound is (8 + 1) x 1e-6 (gpu_check_fla.fla_bound)."""
    fla_check = _load("gpu_check_fla")
    ref = np.random.default_rng(0).standard_normal((20, 8))
    ours = ref + 1e-6
    memo = {("gla", "tiny"): (Path("."), {"vocab_size": 32}, np.arange(20), ref, {},
                              {"float32": ours})}  # fmt: skip
    refs = {"gla/tiny/err/float32": np.array(1e-6)}
    rows = fla_check.check_rivals("gla", refs, memo, _FarFla(ref, off), timed=None)
    (row,) = [r for r in rows if r["check"] == "cupy vs fla forward (float32)"]
    assert row["tol"] == pytest.approx(9e-6, rel=1e-6)
    assert row["ok"] is ok, row
    assert row["kernel"] == "vector_gated_chunks"


def test_without_a_device_it_says_so_and_exits_0(tmp_path):
    """Here (no CUDA driver), as `make gpu-check` runs it: one line saying why, exit 0, the
    report marked skipped; a stray argument is one line and exit 2."""
    from linstream.ops.backend import cupy_unavailable_reason

    if cupy_unavailable_reason() is None:
        pytest.skip("a CUDA device is here: the check would run")
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("GPU_CHECK_CPU_DRYRUN", None)
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check_all.py")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "no usable CUDA device" in proc.stdout
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "skipped"
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check_all.py"), "--bogus"],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stdout.strip() == "gpu_check_all: expected no arguments or --prepare, got --bogus"


def test_a_run_past_its_hard_stop_ends_with_its_rows_written(tmp_path):
    """The watchdog: a run still going at the hard stop (here 6 s, in the dry run's correctness
    section) writes the rows so far to $OUT, says so in one line and exits 3 (~8 s)."""
    env = {**os.environ, "GPU_CHECK_CPU_DRYRUN": "1", "OUT": str(tmp_path),
           "GPU_CHECK_SEED": "7", "GPU_CHECK_HARD_STOP_S": "6"}  # fmt: skip
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check_all.py")], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check_all: STOPPED at " in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "stopped (time)"
    assert report["wall_s"] < 60
    assert (tmp_path / "gpu_check.md").read_text().startswith("device: ")


@pytest.mark.slow
def test_the_one_device_check_runs_on_the_cpu_in_its_dry_run(tmp_path):
    """The whole device check in its CPU dry run (~2 minutes here): exit 0, one JSON and one
    Markdown table in $OUT, every kernel part and every family checked, the speed rows in
    priority order (families beside fla, then the kernels, then ~1.3B, measured or skipped)."""
    env = {**os.environ, "GPU_CHECK_CPU_DRYRUN": "1", "OUT": str(tmp_path), "GPU_CHECK_SEED": "7"}
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check_all.py")], env=env,
                          capture_output=True, text=True, timeout=1200, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gpu_check_all: ok in" in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "ok"
    for key in ("correctness", "rules_correctness", "ssd_dplr_correctness"):
        assert report[key]["cases"] and all(r["ok"] for r in report[key]["cases"]), key
    rows = report["fla"]["rows"]
    checked = {(r["family"], r["check"]) for r in rows if r["ok"] and "err" in r}
    for fam in FAMILIES:
        for check in ("cupy vs CPU float64 (float32)", "cupy vs CPU float64 (bfloat16)",
                      "handoff CPU -> GPU (hidden)", "cupy vs fla forward (float32)"):  # fmt: skip
            if fam == "mamba2" and "fla" in check:  # the dry run's configs have 2 groups, where
                continue  # fla 0.6.0 differs from transformers: a row says it is not compared
            assert (fam, check) in checked, (fam, check)
    assert any(r["family"] == "mamba2" and "not compared" in r.get("error", "") for r in rows)
    big = [r for r in rows if r.get("size") == "1.3B"]
    assert {r["family"] for r in big} == {"gla", "rwkv7"}
    table = (tmp_path / "gpu_check.md").read_text().splitlines()
    assert not [line for line in table if "| FAIL |" in line]
    speed = [line.split("|")[1].strip() for line in table if line.endswith("| speed |")]
    parts = [p for i, p in enumerate(speed) if i == 0 or speed[i - 1] != p]
    assert parts[0] == "fla family" and "kernel" in parts, parts
    assert parts.index("fla family") < parts.index("kernel")


@pytest.mark.slow
def test_a_kernel_that_disagrees_fails_the_run_naming_rule_kernel_and_error(tmp_path):
    """The dry run against a prepared Numba output with one value changed (case 4: the delta
    rule): exit 1, a FAILED line naming the rule, the kernel and the error, a FAIL row in the
    table (~2 minutes here)."""
    refs = tmp_path / "refs" / "numba_rules.npz"
    env = {**os.environ, "GPU_CHECK_CPU_DRYRUN": "1", "GPU_CHECK_SEED": "7"}
    subprocess.run([sys.executable, str(HERE / "gpu_check.py"), "--prepare-numba", str(refs)],
                   env=env, check=True, capture_output=True, timeout=600)  # fmt: skip
    arrays = dict(np.load(refs))
    arrays["4.out"][10, 1, 3] += 0.5
    np.savez(refs, **arrays)
    env.update(OUT=str(tmp_path), GPU_CHECK_NO_NUMBA="1", GPU_CHECK_NUMBA_REFS=str(refs))
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check_all.py")], env=env,
                          capture_output=True, text=True, timeout=1200, check=False)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failed = [x for x in proc.stdout.splitlines() if x.startswith("gpu_check: FAILED")]
    assert len(failed) == 1 and "delta (delta_chunks" in failed[0], failed
    assert "worst error" in failed[0]
    table = (tmp_path / "gpu_check.md").read_text().splitlines()
    fails = [x for x in table if x.endswith("| FAIL |")]
    assert len(fails) == 1 and "delta_chunks" in fails[0], fails
    assert json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "failed"


def test_a_skipped_row_has_no_rate_and_the_tables_pass_over_it(capsys):
    """A ~1.3B row skipped for time has no implementation and no rate: the ratios and the
    printed table pass over it, the Markdown table keeps it (on the first device run such a
    row stopped the check with a KeyError after every row had run)."""
    fla_check = _load("gpu_check_fla")
    rate = {"family": "gla", "size": "110M", "check": "tokens/s", "dtype": "bfloat16", "ok": True}
    rows = [
        {**rate, "impl": "linstream cupy", "tokens_per_s": 100.0},
        {**rate, "impl": "fla forward (cache)", "tokens_per_s": 400.0},
        {"family": "gla", "size": "1.3B", "check": "tokens/s", "ok": True,
         "skipped": "skipped: estimated 117 s, 89 s of the budget left"},
    ]  # fmt: skip
    session = object.__new__(fla_check.Session)  # finish() reads its rows alone
    session.rows = rows
    report: dict = {}
    assert session.finish(report) is True
    assert report["fla"]["ratios"] == {"gla 110M bfloat16": 0.25}
    assert "| gla | 110M | linstream cupy | bfloat16 | 100 |" in capsys.readouterr().out
    table = _load("gpu_check_all").markdown({**report, "device": "test"})
    assert "| fla family | gla | 1.3B | - | - | skipped: estimated 117 s" in table


def test_a_second_speed_only_run_writes_its_table_and_profiles(tmp_path):
    """The second, shorter device run (GPU_CHECK_SPEED_ONLY, two families) in the dry run
    (~15 s with the kernels compiled): the ~110M folders checked against the CPU runtime, their
    tokens/s rows, a profile row per family (helpers/fla_profile.py on the device), the ~1.3B
    rows; exit 0, the kernels' correctness and the tiny folders left out."""
    env = {**os.environ, "GPU_CHECK_CPU_DRYRUN": "1", "OUT": str(tmp_path), "GPU_CHECK_SEED": "7",
           "GPU_CHECK_SPEED_ONLY": "1", "GPU_CHECK_FAMILIES": "gla,delta_net"}  # fmt: skip
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check_all.py")], env=env,
                          capture_output=True, text=True, timeout=500, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["status"] == "ok"
    assert "correctness" not in report and "rules_correctness" not in report
    rows = report["fla"]["rows"]
    assert {r["family"] for r in rows if r.get("size") != "1.3B"} == {"gla", "delta_net"}
    assert not [r for r in rows if r.get("size") == "tiny"]
    assert {(r["family"], r["impl"]) for r in rows if "tokens_per_s" in r} >= {
        ("gla", "linstream cupy"), ("delta_net", "fla forward (cache)")}  # fmt: skip
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| fla | gla 110M | cupy vs CPU float64 (float32) |" in table
    # where one float32 chunk's time went, per family: the kinds' shares of its wall time
    profiles = {r["family"]: r for r in rows if r["check"] == "profile"}
    assert set(profiles) == {"gla", "delta_net"}
    for fam, r in profiles.items():
        kernel = {"gla": "vector_gated_chunks", "delta_net": "delta_chunks"}[fam]
        assert 0 < r["shares"]["products"] < 1 and 0 < r["shares"]["recurrence"] < 1, r
        assert sum(r["shares"].values()) == pytest.approx(1.0), r
        assert kernel in dict(r["top_ms"]), r
        assert f"| profile | {fam} | 110M | products " in table
