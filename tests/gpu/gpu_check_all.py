#!/usr/bin/env python3
"""The device check in one call: every kernel's and every fla family's correctness, then the
speed rows in priority order, under one time budget (≤ 9 minutes wall in all).

Here, once, with the network (`make gpu-prepare`, idempotent): downloads the wheels the device
lacks (tests/gpu/device_wheels.txt: cp312 manylinux, pinned) into build/whl, prepares the
references the device cannot compute (no Numba there) into build/gpu-check (gpu_check.py
--prepare-numba, gpu_check_fla.py --prepare), and prints the carry's size and the exact device
command:

    .venv/bin/python tests/gpu/gpu_check_all.py --prepare

There (`make gpu-check` here; the device has no venv, so the pasted command calls python3):

    run(command="PYTHONUNBUFFERED=1 python3 tests/gpu/gpu_check_all.py",
        carry=["build/whl", "build/gpu-check"], timeout_s=600)

It installs the carried wheels into a scratch folder when fla (or transformers at the pinned
version) does not import, and runs itself again with that folder on PYTHONPATH (the time
spent counts against the budget).  Then, in one process:

1. correctness of every kernel (gpu_check.py's sections 1, 1b, 1c) and of every fla family's
   device runtime (gpu_check_fla.py's phase 1: against the CPU runtime, the CPU→GPU handoff,
   fla's float32 forward against both);
2. the families' tokens/s at 2,048-token chunks beside fla's forward (no family starts past
   FLA_RIVALS_BY);
3. the kernels' throughput rows (additive, SSD/DPLR, the rules; none starts past
   KERNEL_ROWS_BY);
4. the ~1.3B GLA and RWKV-7 rows (gpu_check_big.py), each only when its estimate fits before
   BIG_BY, else a line says it was skipped.

It writes `$OUT/gpu_check.json` (every row) and `$OUT/gpu_check.md` (one Markdown table) and
exits 1 on any correctness failure (3 when a watchdog stops it at HARD_STOP_S, after writing
the rows so far; GPU_CHECK_BUDGET_S scales the budget and every deadline, for a second,
shorter run in the same device session), each failure line naming the family or rule, the kernel and
the worst error.  Without a usable CUDA device (and no dry run) it says so and exits 0.
GPU_CHECK_CPU_DRYRUN=1 runs its logic on the CPU (NumPy and the CUDA emulator standing in for
the device, fla on the CPU, small shapes): tests/gpu/test_gpu_check_all.py keeps that run.
fla's Triton kernels run with TRITON_F32_DEFAULT=ieee (unless set): their float32 dot products
in IEEE float32, not TF32, so that fla's float32 forward is held to linstream's float32 errors
(gpu_check_fla.fla_bound) and the float32 speed rows compare like with like.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "gpu"
WHEELS = ROOT / "build" / "whl"
REFS = ROOT / "build" / "gpu-check"
CARRY = ["build/whl", "build/gpu-check"]
COMMAND = "PYTHONUNBUFFERED=1 python3 tests/gpu/gpu_check_all.py"
TIMEOUT_S = 600  # the device's per-command limit; the budget below leaves a minute of it
# 9 minutes from the first start (the wheels' install included); GPU_CHECK_BUDGET_S=240 (say)
# for a second, shorter run in the same device session: every deadline below scales with it
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "540"))
FLA_RIVALS_BY = 0.61 * BUDGET_S  # 330 s: no family starts its tokens/s rows past this
KERNEL_OPTIONAL_BY = 0.74 * BUDGET_S  # 400 s: the additive throughput's rows, stage breakdown
KERNEL_ROWS_BY = 0.85 * BUDGET_S  # 460 s: no SSD/DPLR or rules throughput row starts past this
BIG_BY = 0.955 * BUDGET_S  # 515 s: a ~1.3B family runs only when its estimate ends before this
# GPU_CHECK_SPEED_ONLY=1: a second run after a full one (the kernels' correctness, fla's
# agreement and the kernels' throughput left out): the families' ~110M folders against the CPU
# runtime, then their tokens/s beside fla's (none starts past SPEED_RIVALS_BY), then ~1.3B
SPEED_RIVALS_BY = 0.8 * BUDGET_S
# a watchdog writes what there is and exits 3 (a row ran past its budget, or hung)
HARD_STOP_S = float(os.environ.get("GPU_CHECK_HARD_STOP_S", str(BUDGET_S + 20)))
DRY_RUN = os.environ.get("GPU_CHECK_CPU_DRYRUN", "") not in ("", "0")
STARTED = float(os.environ.get("GPU_CHECK_STARTED", "0")) or time.time()


def _pins() -> dict[str, str]:
    out = {}
    for line in (HERE / "device_wheels.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            out[name.strip()] = version.strip()
    return out


def _importable() -> bool:
    """fla imports and transformers is at the pinned version (the device's own is older)."""
    if importlib.util.find_spec("fla") is None:
        return False
    try:
        return importlib.metadata.version("transformers") == _pins()["transformers"]
    except importlib.metadata.PackageNotFoundError:
        return False


def ensure_wheels(argv: list[str]) -> None:
    """Install the carried wheels into a scratch folder and run this script again with it on
    PYTHONPATH, when fla or the pinned transformers does not import (never in the dry run)."""
    if DRY_RUN or os.environ.get("GPU_CHECK_SITE") or _importable():
        return
    wheels = sorted(str(p) for p in WHEELS.glob("*.whl"))
    if not wheels:
        print(f"gpu_check_all: no wheels in {WHEELS} (make gpu-prepare, then carry it): "
              "fla's rows will be absent")  # fmt: skip
        return
    site = Path(tempfile.gettempdir()) / "linstream-gpu-site"
    print(f"gpu_check_all: installing {len(wheels)} carried wheels into {site}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--target", str(site), *wheels], check=True)  # fmt: skip
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "GPU_CHECK_SITE": str(site),
           "GPU_CHECK_STARTED": repr(STARTED)}  # fmt: skip
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *argv], env)


def _fresh(target: Path, sources: list[Path]) -> bool:
    return target.exists() and target.stat().st_mtime >= max(p.stat().st_mtime for p in sources)


def prepare() -> int:
    """`make gpu-prepare`: the wheels, both reference files, the carry's size, the command."""
    pins = _pins()
    have = {tuple(p.name.split("-")[:2]) for p in WHEELS.glob("*.whl")}
    have = {(n.lower().replace("_", "-"), v) for n, v in have}
    missing = [n for n in pins if (n.lower(), pins[n]) not in have]
    if missing:
        print(f"gpu-prepare: downloading {len(missing)} wheels into {WHEELS}")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                        "cp", "--platform", "manylinux2014_x86_64", "--platform",
                        "manylinux_2_17_x86_64", "--platform", "manylinux_2_27_x86_64",
                        "--platform", "manylinux_2_28_x86_64", "-d", str(WHEELS),
                        *(f"{n}=={pins[n]}" for n in missing)], check=True)  # fmt: skip
    else:
        print(f"gpu-prepare: the {len(pins)} wheels are in {WHEELS}")
    # what each file's content depends on: its script, the shared helpers, the runtime
    common = [*(ROOT / "tests" / "helpers").glob("*.py"), *(ROOT / "ops").rglob("*.py")]
    for target, cmd, scripts in (
        (REFS / "numba_rules.npz", [str(HERE / "gpu_check.py"), "--prepare-numba"],
         ["gpu_check_rules.py", "gpu_check_ssd_dplr.py"]),
        (REFS / "fla_refs.npz", [str(HERE / "gpu_check_fla.py"), "--prepare"],
         ["gpu_check_fla.py"]),
    ):  # fmt: skip
        also = [REFS / "ssd_dplr_refs.npz"] if target.name == "numba_rules.npz" else []
        if all(_fresh(t, [*common, *(HERE / s for s in scripts)]) for t in [target, *also]):
            print(f"gpu-prepare: {target.relative_to(ROOT)} is newer than its sources: kept")
            continue
        print(f"gpu-prepare: preparing {target.relative_to(ROOT)} (minutes: the CPU runtime)")
        subprocess.run([sys.executable, *cmd, str(target)], check=True)
    size = sum(p.stat().st_size for d in CARRY for p in (ROOT / d).rglob("*") if p.is_file())
    # what travels beside the carry: tracked and untracked-not-ignored files (64 MiB in all)
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    tree = sum(
        (ROOT / f.decode()).stat().st_size for f in listed if f and (ROOT / f.decode()).is_file()
    )
    total = size + tree
    print(f"gpu-prepare: carry {CARRY}: {size / 2**20:.1f} MiB, with the working tree "
          f"{total / 2**20:.1f} MiB (the limit is 64 MiB)")  # fmt: skip
    print("gpu-prepare: the device command:\n"
          f"run(command={COMMAND!r}, carry={CARRY!r}, timeout_s={TIMEOUT_S})\n"
          "(a second, shorter run in the same session: GPU_CHECK_BUDGET_S=240 before python3, "
          "timeout_s=300)")  # fmt: skip
    return 0 if total < 60 * 2**20 else 1


def _elapsed() -> float:
    return time.time() - STARTED


def _correctness_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """(part, what, check, kernel, worst error, tolerance, ok) for every correctness row."""
    out = []
    for part, key in (("additive", "correctness"), ("rules", "rules_correctness"),
                      ("ssd/dplr", "ssd_dplr_correctness")):  # fmt: skip
        for r in report.get(key, {}).get("cases", []):
            what = r.get("rule", "additive")
            check = r.get("check") or r.get("what") or f"{r.get('dtype')} T={r.get('T')}"
            err = r.get("err", r.get("err_max"))
            out.append((part, what, str(check), r.get("kernel", "cupy_causal"), _g(err),
                        _g(r.get("tol")), "ok" if r["ok"] else "FAIL"))  # fmt: skip
    for r in report.get("fla", {}).get("rows", []):
        if "err" in r or not r["ok"]:
            out.append(("fla", f"{r['family']} {r.get('size', '')}".strip(), r["check"],
                        r.get("kernel", "-"), _g(r.get("err")), _g(r.get("tol")),
                        "ok" if r["ok"] else "FAIL"))  # fmt: skip
    return out


def _speed_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    """(part, what, size, implementation, dtype, tokens/s) in priority order."""
    out = []
    for r in report.get("fla", {}).get("rows", []):
        if r.get("check") == "tokens/s":
            rate = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else r.get("skipped", "")
            out.append(("fla family", r["family"], r["size"], r.get("impl", "-"),
                        r.get("dtype", "-"), rate))  # fmt: skip
    shape = report.get("shape", {})
    for r in report.get("throughput", []):
        rate = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else str(r.get("error"))
        out.append(("additive", "linear attention", f"T={shape.get('T')}", r["impl"],
                    r["dtype"], rate))  # fmt: skip
    for key in ("ssd_dplr_throughput", "rules_throughput"):
        for r in report.get(key, {}).get("rows", []):
            rate = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else str(r.get("error"))
            out.append(("kernel", r["rule"], "-", r["impl"], r["dtype"], rate))
    return out


def _g(x: Any) -> str:
    """A table cell: floats to 3 digits (a tuple of errors, e.g. out / S / z, each)."""
    if isinstance(x, (list, tuple)):
        return ", ".join(_g(v) for v in x)
    return f"{x:.3g}" if isinstance(x, float) else ("" if x is None else str(x))


def markdown(report: dict[str, Any]) -> str:
    """One Markdown table: correctness rows first, then the speed rows in priority order."""
    lines = [f"device: {report.get('device')}; status: {report.get('status')}; "
             f"wall {report.get('wall_s', 0):.0f} s; versions: {report.get('versions')}", "",
             "| part | what | check or size | kernel or implementation | worst error or "
             "dtype | tolerance or tokens/s | ok |", "|---|---|---|---|---|---:|---|"]  # fmt: skip
    for part, what, check, kernel, err, tol, ok in _correctness_rows(report):
        lines.append(f"| {part} | {what} | {check} | {kernel} | {err} | {tol} | {ok} |")
    for part, what, size, impl, dtype, rate in _speed_rows(report):
        lines.append(f"| {part} | {what} | {size} | {impl} | {dtype} | {rate} | speed |")
    import gpu_check_fla

    for r in report.get("fla", {}).get("rows", []):
        if r.get("check") == "profile":
            lines.append(f"| profile | {r['family']} | {r['size']} | "
                         f"{gpu_check_fla.profile_text(r)} | {r['dtype']} | "
                         f"{r['wall_ms']:.1f} ms | profile |")  # fmt: skip
    return "\n".join(lines) + "\n"


def check() -> int:
    """The device check (the module docstring's order); 1 on any correctness failure."""
    os.environ.setdefault("TRITON_F32_DEFAULT", "ieee")
    sys.path.insert(0, str(HERE))
    import gpu_check
    import gpu_check_big
    import gpu_check_fla

    speed_only = gpu_check_fla.SPEED_ONLY  # its GPU_CHECK_SPEED_ONLY (see SPEED_RIVALS_BY)
    # one clock for all: the modules' T0 back-dated to this run's first start
    gpu_check.T0 = gpu_check_fla.T0 = time.perf_counter() - _elapsed()
    report: dict[str, Any] = {"budget_s": BUDGET_S}
    _watchdog(report, HARD_STOP_S - _elapsed())
    cp = gpu_check.setup(report)
    ok = True
    if cp is not None:
        sync = _sync(cp)
        timed = lambda fn: gpu_check.timed(fn, sync, 5, warmup=2)  # noqa: E731
        print(f"\n== 1. correctness: kernels, then every fla family ({_elapsed():.0f} s) ==")
        if not speed_only:
            ok = gpu_check.correctness(report, gpu_check.seed_from_env())
        session = gpu_check_fla.Session(report)
        session.sync = sync
        session.correctness()
        if not speed_only:
            session.agreement()
        print(f"\n== 2. families' tokens/s beside fla's forward ({_elapsed():.0f} s) ==")
        session.rivals(timed, SPEED_RIVALS_BY if speed_only else FLA_RIVALS_BY)
        if not speed_only:
            print(f"\n== 3. kernels' throughput ({_elapsed():.0f} s) ==")
            ok = gpu_check.speed(report, cp, KERNEL_OPTIONAL_BY, KERNEL_ROWS_BY) and ok
        print(f"\n== 4. ~1.3B rows ({_elapsed():.0f} s) ==")
        gpu_check_big.run(session, timed, BIG_BY)
        ok = session.finish(report) and ok
        report["status"] = "ok" if ok else "failed"
    report["wall_s"] = _elapsed()
    _write(report)
    print(f"\ngpu_check_all: {report.get('status')} in {_elapsed():.0f} s "
          f"(budget {BUDGET_S:.0f} s)")  # fmt: skip
    return 0 if ok else 1


def _write(report: dict[str, Any]) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
        (Path(out) / "gpu_check.md").write_text(markdown(report))
        print(f"gpu_check_all: wrote {out}/gpu_check.json and gpu_check.md")


def _watchdog(report: dict[str, Any], after_s: float) -> None:
    """Past HARD_STOP_S (a row that ran far past its deadline, or hung): write the rows so far,
    say so, exit 3, so the device command ends inside its timeout with its files."""
    import threading

    def stop() -> None:
        print(f"\ngpu_check_all: STOPPED at {_elapsed():.0f} s (hard stop {HARD_STOP_S:.0f} "
              "s): the rows so far are written; the last section above did not finish")  # fmt: skip
        try:
            _write({**report, "status": "stopped (time)", "wall_s": _elapsed()})
        except Exception as ex:  # the report changing under us: say so, still exit
            print(f"gpu_check_all: could not write the report: {type(ex).__name__}: {ex}")
        sys.stdout.flush()
        os._exit(3)

    timer = threading.Timer(max(after_s, 0.0), stop)
    timer.daemon = True
    timer.start()


def _sync(cp: Any) -> Any:
    if DRY_RUN:
        return lambda: None

    def sync() -> None:
        cp.cuda.Device().synchronize()
        try:
            import torch

            torch.cuda.synchronize()
        except ImportError:
            pass

    return sync


def main(argv: list[str]) -> int:
    if argv == ["--prepare"]:
        return prepare()
    if argv:
        print(f"gpu_check_all: expected no arguments or --prepare, got {' '.join(argv)}")
        return 2
    ensure_wheels(argv)
    return check()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
