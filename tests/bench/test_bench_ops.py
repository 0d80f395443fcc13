"""Throughput of causal linear attention: the numba kernel vs its previous version and PyTorch.

    make bench      (= pytest tests/bench -m bench -s)
    pytest tests/bench/test_bench_ops.py -m bench -s -p no:randomly

H=8, T=65536 (d=64), float32 inputs, elu+1, float64 carried state for linstream (its default).
Work counted as 4·d_k·d_v FLOPs per head-token (state update + read), the minimum.  The float32
matmul rate (NumPy 2048³, 2 threads) is measured before every contender in every round (it moved
by 2× within one run on the shared machine); the best of those measurements counts, and the
spread is reported.  Rivals in the same run, interleaved, best of 3:

- numba: `causal_linear_attention(backend="numba")` at each chunk size;
- numba, previous: the kernel as it was at commit BASE_COMMIT (four BLAS products per chunk),
  loaded from git history (skipped where git or the commit is missing);
- numba, recurrent v1 (LANDED_COMMIT, the per-head token recurrence this kernel replaced), in
  the repeated decisive comparison only;
- PyTorch tuned: φ per chunk, z folded into an extra column of V, batched matmuls, buffers
  allocated once, float32 state; PyTorch straightforward: what a user would write;
- recurrent prototype (recurrent_prototype.py): a few dozen lines of Numba, one head per task,
  token by token, float32 state, compile-time widths; on the [T, H, d] inputs the kernel gets,
  and on head-major [H, T, d] copies made before the timing (test_bench_kernel_vs_prototype).

Results: the plots docs/img/kernel-chunks.png and kernel-widths.png, and the run's tables, printed
and written to build/bench/ops.md; docs/benchmarks.md carries the tables of record.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np
import pytest
from helpers.bench_report import report
from helpers.plotting import IMG_DIR, bar_plot, line_plot
from helpers.recurrent_prototype import recurrent_prototype, recurrent_prototype_htd
from linstream.ops import AttentionState, causal_linear_attention
from linstream.ops.feature_maps import get_feature_map
from threadpoolctl import threadpool_limits

H, D, T = 8, 64, 65536
CHUNKS = (32, 64, 128, 256)
# (d_k, d_v) for the head-width table; T scaled so that each call does about the same work
WIDTHS = ((16, 16), (32, 32), (64, 64), (128, 128), (64, 32), (32, 128))
BASE_COMMIT = "d311f34"  # the kernel before the recurrent rewrite
LANDED_COMMIT = "789a260"  # the first recurrent kernel (one head per task, one token per pass)
REPEATS = 3  # the decisive comparison (numba vs previous at C=64, share of the rate), repeated
COMMAND = "pytest tests/bench/test_bench_ops.py -m bench -s -p no:randomly"
HEADER = f"# Ops benchmark\n\nCommand: `{COMMAND}`"


def _inputs(t, dk, dv, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, H, dk), dtype=np.float32)
    k = rng.standard_normal((t, H, dk), dtype=np.float32)
    v = rng.standard_normal((t, H, dv), dtype=np.float32)
    return q, k, v


def _previous_kernel(commit=BASE_COMMIT):
    """numba_causal as of `commit`, imported from git history, or None."""
    root = Path(__file__).resolve().parents[2]
    try:
        src = subprocess.run(
            ["git", "show", f"{commit}:ops/additive/numba.py"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp(prefix="linstream-bench-")) / "numba_previous.py"
    path.write_text(src)
    name = f"linstream.ops._numba_{commit}"  # relative imports resolve in linstream.ops
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # Numba's cache looks the module up by name
    spec.loader.exec_module(mod)
    fm = get_feature_map("elu+1")

    def run(q, k, v, chunk):
        st = AttentionState.zeros(q.shape[1], q.shape[2], v.shape[2])
        return mod.numba_causal(
            q, k, v, st, feature_map=fm, eps=1e-6, chunk_size=chunk, dtype=np.float32
        )[0]

    return run


def torch_chunked(torch, q, k, v, chunk, eps=1e-6):
    """What a user would write in PyTorch: φ, then a loop over chunks with a carried S, z."""
    q = torch.nn.functional.elu(q.transpose(0, 1)) + 1  # [H, T, d]
    k = torch.nn.functional.elu(k.transpose(0, 1)) + 1
    v = v.transpose(0, 1)
    h, t, d = q.shape
    s = torch.zeros(h, d, v.shape[2])
    z = torch.zeros(h, d, 1)
    mask = torch.tril(torch.ones(chunk, chunk))
    outs = []
    for i in range(0, t, chunk):
        qc, kc, vc = q[:, i : i + chunk], k[:, i : i + chunk], v[:, i : i + chunk]
        n = qc.shape[1]
        a = (qc @ kc.transpose(1, 2)) * mask[:n, :n]
        num = qc @ s + a @ vc
        den = qc @ z + a.sum(-1, keepdim=True)
        outs.append(num / (den + eps))
        s = s + kc.transpose(1, 2) @ vc
        z = z + kc.sum(1, keepdim=True).transpose(1, 2)
    return torch.cat(outs, 1).transpose(0, 1)


def torch_tuned(torch, q, k, v, chunk, eps=1e-6):
    """A tuned PyTorch loop: φ per chunk, z as an extra column of V (one product serves numerator
    and denominator), batched matmuls into buffers allocated once, float32 state."""
    t, h, d = q.shape
    dv = v.shape[2]
    f = torch.nn.functional
    qh, kh = q.transpose(0, 1), k.transpose(0, 1)  # [H, T, d] views
    vx = torch.ones(h, t, dv + 1)
    vx[:, :, :dv] = v.transpose(0, 1)
    s = torch.zeros(h, d, dv + 1)
    out = torch.empty(h, t, dv)
    mask = torch.ones(chunk, chunk).tril_()
    a = torch.empty(h, chunk, chunk)
    nd = torch.empty(h, chunk, dv + 1)
    for i in range(0, t, chunk):
        n = min(chunk, t - i)
        qc = f.elu(qh[:, i : i + n]).add_(1)
        kc = f.elu(kh[:, i : i + n]).add_(1)
        vc = vx[:, i : i + n]
        an, ndn = a[:, :n, :n], nd[:, :n]
        torch.bmm(qc, kc.transpose(1, 2), out=an).mul_(mask[:n, :n])
        torch.bmm(an, vc, out=ndn)
        ndn.baddbmm_(qc, s)
        torch.div(ndn[..., :dv], ndn[..., dv:] + eps, out=out[:, i : i + n])
        s.baddbmm_(kc.transpose(1, 2), vc)
    return out.transpose(0, 1)


def _with_roof(contenders, rounds=3):
    """Best wall time of each contender over `rounds` interleaved rounds, with a NumPy 2048³
    float32 matmul timed before every contender and once more at the end.

    Returns (best times, roof, roof line): the roof is the best matmul rate of the run (the
    machine's rate when the second vCPU is free); the line reports best, median and worst."""
    n = 2048
    rng = np.random.default_rng(1)
    ma = rng.standard_normal((n, n), dtype=np.float32)
    mb = rng.standard_normal((n, n), dtype=np.float32)
    ma @ mb
    for fn in contenders.values():
        fn()
    best = dict.fromkeys(contenders, float("inf"))
    mm = []

    def matmul():
        t0 = time.perf_counter()
        ma @ mb
        mm.append(time.perf_counter() - t0)

    for _ in range(rounds):
        for name, fn in contenders.items():
            matmul()
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    matmul()
    rates = sorted(2.0 * n**3 / t for t in mm)
    roof = rates[-1]
    line = (
        f"float32 matmul rate (NumPy {n}³), {len(rates)} measurements interleaved "
        f"with the contenders: best {roof / 1e9:.0f}, median {rates[len(rates) // 2] / 1e9:.0f}, "
        f"worst {rates[0] / 1e9:.0f} GFLOP/s; the best counts"
    )
    return best, roof, line


@pytest.mark.bench
def test_bench_kernel_vs_chunk_size():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(2)
    q, k, v = _inputs(T, D, D)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    previous = _previous_kernel()

    # each implementation at the chunk sizes around its best (the rivals' C=32 runs are the
    # slowest and add nothing but time on a busy machine)
    runs = {
        "numba": (
            CHUNKS,
            lambda c: causal_linear_attention(q, k, v, backend="numba", chunk_size=c),
        ),
        "PyTorch tuned": ((64, 128, 256), lambda c: torch_tuned(torch, tq, tk, tv, c)),
        "PyTorch straightforward": ((64, 256), lambda c: torch_chunked(torch, tq, tk, tv, c)),
    }
    if previous is not None:
        runs["numba, previous"] = ((64, 128, 256), lambda c: previous(q, k, v, c))
    contenders = {(a, c): functools.partial(fn, c) for a, (cs, fn) in runs.items() for c in cs}
    # the same two kernels on one thread: the per-core ratio, which a busy second vCPU hides
    one_thread = {"numba, 1 thread": lambda: causal_linear_attention(q, k, v, backend="numba")}
    if previous is not None:
        one_thread["numba, previous, 1 thread"] = lambda: previous(q, k, v, 64)

    # the contenders compute the same thing (float64 oracle on a prefix)
    n = 4096
    q64, k64, v64 = (x[:n].astype(np.float64) for x in (q, k, v))
    ref, _ = causal_linear_attention(q64, k64, v64, backend="numpy")
    with torch.inference_mode():
        outs = {
            "numba": causal_linear_attention(q[:n], k[:n], v[:n], backend="numba")[0],
            "tuned": torch_tuned(torch, tq[:n], tk[:n], tv[:n], 64).numpy(),
            "straightforward": torch_chunked(torch, tq[:n], tk[:n], tv[:n], 64).numpy(),
        }
        if previous is not None:
            outs["previous"] = previous(q[:n], k[:n], v[:n], 64)
    for name, out in outs.items():
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=name)

    with torch.inference_mode():
        best, roof, roof_line = _with_roof({f"{a} C={c}": fn for (a, c), fn in contenders.items()})
    numba.set_num_threads(1)
    try:
        with threadpool_limits(1):
            best1, roof1, _ = _with_roof(one_thread)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    flops = H * 4 * D * D
    rate = {key: T / best[f"{key[0]} C={key[1]}"] for key in contenders}
    names = list(runs)
    best_of = {a: max(rate[(a, c)] for c in runs[a][0]) for a in names}
    default = rate[("numba", 64)]
    lines = [
        f"H={H}, d_k=d_v={D}, T={T}, float32 inputs, elu+1, float64 state (linstream); "
        f"{platform.machine()}, {os.cpu_count()} CPUs; one run, contenders interleaved",
        roof_line,
        "",
        "| implementation | " + " | ".join(f"C={c} tokens/s" for c in CHUNKS) + " | best, % of "
        "matmul rate |",
        "|---|" + "---:|" * (len(CHUNKS) + 1),
    ]
    for a in names:
        cells = " | ".join(f"{rate[(a, c)]:,.0f}" if (a, c) in rate else "" for c in CHUNKS)
        lines.append(f"| {a} | {cells} | {100 * best_of[a] * flops / roof:.1f}% |")
    lines += [
        "",
        f"numba default (C=64): {default:,.0f} tokens/s, {100 * default * flops / roof:.1f}% of "
        f"the matmul rate (target ≥ 30%: {0.3 * roof / flops:,.0f} tokens/s here)",
    ]
    if previous is not None:
        lines.append(
            f"numba default / previous kernel at its default (C=64): "
            f"{default / rate[('numba, previous', 64)]:.2f}× (target ≥ 2×)"
        )
    for a in names[1:]:
        lines.append(f"numba best / {a} best: {best_of['numba'] / best_of[a]:.2f}×")
    lines.append(f"One thread (matmul rate {roof1 / 1e9:.0f} GFLOP/s on one thread), C=64:")
    for a, t1 in best1.items():
        lines.append(
            f"- {a}: {T / t1:,.0f} tokens/s, {100 * T / t1 * flops / roof1:.1f}% of the one-thread "
            "rate"
            + (
                f" (numba is {t1 / best1['numba, 1 thread']:.2f}× faster)"
                if "previous" in a
                else ""
            )
        )
    line_plot(
        IMG_DIR / "kernel-chunks.png",
        f"Causal linear attention, H={H}, d={D}, T={T}, float32 (one run, interleaved)",
        {a: (runs[a][0], [rate[(a, c)] for c in runs[a][0]]) for a in names},
        xlabel="chunk size C (tokens)",
        ylabel="tokens/s",
        hlines={"30% of the float32 matmul rate": 0.3 * roof / flops},
        note=f"{platform.machine()}, {os.cpu_count()} CPUs; roof {roof / 1e9:.0f} GFLOP/s",
    )
    report("ops", "\n".join(lines), header=HEADER)


@pytest.mark.bench
def test_bench_kernel_head_widths():
    """numba default (C=64) at d ∈ {16, 32, 64, 128} and d_k ≠ d_v, beside PyTorch tuned."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(2)
    previous = _previous_kernel()
    contenders, work = {}, {}
    for dk, dv in WIDTHS:
        t = int(min(65536, max(4096, T // 4 * D * D // (dk * dv))))
        q, k, v = _inputs(t, dk, dv, seed=dk + dv)
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        w = f"{dk}x{dv}"
        work[w] = (t, H * 4 * dk * dv)
        contenders[f"numba {w}"] = lambda q=q, k=k, v=v: causal_linear_attention(
            q, k, v, backend="numba"
        )
        if previous is not None:
            contenders[f"numba, previous {w}"] = lambda q=q, k=k, v=v: previous(q, k, v, 64)
        contenders[f"PyTorch tuned {w}"] = lambda tq=tq, tk=tk, tv=tv: torch_tuned(
            torch, tq, tk, tv, 128
        )
    with torch.inference_mode():
        best, roof, roof_line = _with_roof(contenders)
    names = ["numba"] + (["numba, previous"] if previous is not None else []) + ["PyTorch tuned"]
    lines = [
        "",
        f"## Head widths (H={H}, float32, elu+1; numba at C=64, PyTorch tuned at C=128)",
        roof_line,
        "",
        "| d_k×d_v | T | " + " | ".join(f"{n} tokens/s (% of rate)" for n in names) + " |",
        "|---|---:|" + "---:|" * len(names),
    ]
    pct = {n: [] for n in names}
    for w, (t, flops) in work.items():
        cells = []
        for n in names:
            r = t / best[f"{n} {w}"]
            pct[n].append(100 * r * flops / roof)
            cells.append(f"{r:,.0f} ({pct[n][-1]:.1f}%)")
        lines.append(f"| {w} | {t} | " + " | ".join(cells) + " |")
    bar_plot(
        IMG_DIR / "kernel-widths.png",
        f"Share of the float32 matmul rate by head width (H={H}, one run)",
        list(work),
        pct,
        ylabel="% of matmul rate (4·d_k·d_v FLOPs per head-token)",
        hlines={"30%": 30.0},
        note=f"{platform.machine()}, {os.cpu_count()} CPUs; roof {roof / 1e9:.0f} GFLOP/s",
    )
    report("ops", "\n".join(lines), header=HEADER)


@pytest.mark.bench
def test_bench_kernel_decisive_repeats():
    """The decisive comparison, REPEATS times in one process: numba at C=64 against the previous
    kernel and the first recurrent one at C=64, each repetition a fresh best of 3 with its own
    interleaved matmul rate, on 2 threads and then on one (numba and BLAS held to one thread: the
    per-core ratio, which a busy second vCPU hides).  The machine is shared: one repetition can
    be unlucky, so all are reported."""
    q, k, v = _inputs(T, D, D)
    rivals = {"numba": lambda: causal_linear_attention(q, k, v, backend="numba", chunk_size=64)}
    previous = _previous_kernel()
    if previous is not None:
        rivals["numba, previous"] = lambda: previous(q, k, v, 64)
    landed = _previous_kernel(LANDED_COMMIT)
    if landed is not None:
        rivals["numba, recurrent v1"] = lambda: landed(q, k, v, 64)
    flops = H * 4 * D * D

    def ratio(rate, n):
        return f"{rate['numba'] / rate[n]:.2f}×" if n in rate else ""

    lines = [
        "",
        f"## Decisive comparison, {REPEATS} repetitions (H={H}, d={D}, T={T}, C=64, float32, "
        "elu+1, float64 state)",
        "",
        "| repetition | threads | matmul rate, best (median) GFLOP/s | "
        + " | ".join(f"{n} tokens/s" for n in rivals)
        + " | numba, % of rate | numba / previous | numba / recurrent v1 |",
        "|---|---:|---:|" + "---:|" * (len(rivals) + 3),
    ]
    for r in range(REPEATS):
        for threads in (2, 1):
            numba.set_num_threads(threads)
            try:
                with threadpool_limits(threads):
                    best, roof, roof_line = _with_roof(rivals)
            finally:
                numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
            rate = {n: T / t for n, t in best.items()}
            median = roof_line.split("median ")[1].split(",")[0]
            lines.append(
                f"| {r + 1} | {threads} | {roof / 1e9:.0f} ({median}) | "
                + " | ".join(f"{x:,.0f}" for x in rate.values())
                + f" | {100 * rate['numba'] * flops / roof:.1f}% | "
                f"{ratio(rate, 'numba, previous')} | {ratio(rate, 'numba, recurrent v1')} |"
            )
    report("ops", "\n".join(lines), header=HEADER)


@pytest.mark.bench
def test_bench_kernel_vs_prototype():
    """The kernel (C=64, float64 state) against the simple recurrent prototype, on 2 threads and
    on one, interleaved, best of PROTOTYPE_ROUNDS, each thread count with its matmul rate."""
    q, k, v = _inputs(T, D, D)
    heads = [np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (q, k, v)]
    oh = np.empty(heads[2].shape, np.float32)
    rivals = {
        "numba kernel": lambda: causal_linear_attention(q, k, v, backend="numba"),
        "prototype, [T, H, d] in": lambda: recurrent_prototype(q, k, v),
        "prototype, [H, T, d] in": lambda: recurrent_prototype_htd(*heads, oh),
    }
    n = 4096
    ref, _ = causal_linear_attention(
        *(x[:n].astype(np.float64) for x in (q, k, v)), backend="numpy"
    )
    small = [np.ascontiguousarray(x[:, :n]) for x in heads]
    o_small = np.empty(small[2].shape, np.float32)
    recurrent_prototype_htd(*small, o_small)
    for name, out in {
        "kernel": causal_linear_attention(q[:n], k[:n], v[:n], backend="numba")[0],
        "prototype": recurrent_prototype(q[:n], k[:n], v[:n]),
        "prototype, head-major": o_small.transpose(1, 0, 2),
    }.items():
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4, err_msg=name)
    flops = H * 4 * D * D
    lines = [
        "",
        f"## The kernel against a simple recurrent prototype (H={H}, d={D}, T={T}, float32 in; "
        "kernel: float64 state, C=64; prototype: float32 state)",
        f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "",
        "| threads | matmul rate, best (median) GFLOP/s | "
        + " | ".join(f"{n} tokens/s" for n in rivals)
        + " | kernel / prototype [T,H,d] | kernel / prototype [H,T,d] |",
        "|---:|---:|" + "---:|" * (len(rivals) + 2),
    ]
    rounds = int(os.environ.get("LINSTREAM_BENCH_ROUNDS", 7))
    for threads in (2, 1):
        numba.set_num_threads(threads)
        try:
            with threadpool_limits(threads):
                best, roof, roof_line = _with_roof(rivals, rounds=rounds)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        rate = {name: T / t for name, t in best.items()}
        median = roof_line.split("median ")[1].split(",")[0]
        kern = rate["numba kernel"]
        lines.append(
            f"| {threads} | {roof / 1e9:.0f} ({median}) | "
            + " | ".join(f"{x:,.0f} ({100 * x * flops / roof:.0f}%)" for x in rate.values())
            + f" | {kern / rate['prototype, [T, H, d] in']:.2f}× "
            f"| {kern / rate['prototype, [H, T, d] in']:.2f}× |"
        )
    lines.append(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    report("ops", "\n".join(lines), header=HEADER)
