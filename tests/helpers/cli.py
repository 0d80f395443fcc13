"""Run the `linstream` command in a subprocess, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

LINSTREAM = str(Path(sys.executable).with_name("linstream"))


def linstream(*args: str, cwd: Any = None, timeout: float = 300, env: Any = None) -> Any:
    """`linstream ARGS...`: the CompletedProcess (text stdout and stderr)."""
    return subprocess.run(
        [LINSTREAM, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def start(*args: str, cwd: Any = None, env: Any = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [LINSTREAM, *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def one_error_line(proc: Any) -> str:
    """The single stderr line of a refused command (asserting there is exactly one)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


def write_texts(root: Path, texts: dict[str, str]) -> Path:
    for rel, text in texts.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
