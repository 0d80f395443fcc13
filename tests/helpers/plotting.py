"""PNG plots for the benchmarks (matplotlib, no display needed): the figures README embeds.

    line_plot(path, title, series={"numba": (xs, ys), ...}, xlabel=..., ylabel=...)
    bar_plot(path, title, groups=["d=16", ...], series={"numba": [..], ...}, ylabel=...)

The images go to docs/img/ (IMG_DIR), overwritten by each benchmark run so they stay true.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

IMG_DIR = Path(__file__).resolve().parents[2] / "docs" / "img"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def line_plot(
    path: Path,
    title: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    xlabel: str,
    ylabel: str,
    hlines: Mapping[str, float] | None = None,
    note: str = "",
) -> Path:
    """One line per series (x, y), log2 x axis (chunk sizes), optional labelled horizontal lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for name, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", label=name)
    for name, y in (hlines or {}).items():
        ax.axhline(y, linestyle="--", linewidth=1, color="grey")
        ax.annotate(name, (0.01, y), xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
    ax.set_xscale("log", base=2)
    xs_all = sorted({x for xs, _ in series.values() for x in xs})
    ax.set_xticks(xs_all, [str(int(x)) for x in xs_all])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="grey")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def bar_plot(
    path: Path,
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    ylabel: str,
    hlines: Mapping[str, float] | None = None,
    note: str = "",
) -> Path:
    """Grouped bars: one group per entry of `groups`, one bar per series in each group."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, ys) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, list(ys), width=width, label=name)
    for name, y in (hlines or {}).items():
        ax.axhline(y, linestyle="--", linewidth=1, color="grey")
        ax.annotate(name, (0.01, y), xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="grey")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
