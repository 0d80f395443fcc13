"""Where a benchmark run's tables go: printed, and written to build/bench/<name>.md.

    report("ops", text, header="# Ops benchmark\n\nCommand: `...`")
    # prints text, writes build/bench/ops.md

build/ is not tracked: benchmarks never write into the sources.  The tables of record, with
the command and the machine's load beside each, are copied by hand into docs/benchmarks.md.
The first report of a name in a process replaces its file (the header first), later ones
append, so a file holds one run of its benchmark however many of that benchmark's tests ran
(or were picked by `-k`).
"""

from __future__ import annotations

from pathlib import Path

OUT_DIR = Path(__file__).resolve().parents[2] / "build" / "bench"
_started: set[Path] = set()


def report(name: str, text: str, *, header: str = "") -> Path:
    """Print `text` and write it to OUT_DIR/<name>.md: replaced, `header` first, on this
    process's first report of `name`, appended after.  Returns the file's path."""
    path = OUT_DIR / f"{name}.md"
    body = text.strip("\n") + "\n"
    if path in _started:
        with path.open("a") as f:
            f.write("\n" + body)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((header.strip("\n") + "\n\n" if header else "") + body)
        _started.add(path)
    print("\n" + body + f"(written to {path})", flush=True)
    return path
