"""`linstream results inspect OUTPUT` as a user runs it on a job's output folder: per sequence
its chunks, gaps, doubled rows, tokens, finality and embedding norms (a table, or `--json`), and
`--plot` drawing each sequence's chunk-to-chunk cosine similarity (the PNG read back)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, write_texts
from linstream.pipeline.io import read_results

pytestmark = pytest.mark.e2e  # whole jobs and commands in subprocesses: `make check` leaves it out

SEED = 5


@pytest.fixture
def job(tmp_path, tiny_model_path):
    print(f"seed {SEED}")
    rng = np.random.default_rng(SEED)
    texts = {
        "long.txt": "".join(rng.choice(list("abcdefgh \n"), size=900)),
        "notes/short.txt": "".join(rng.choice(list("ijklmnop \n"), size=150)),
    }
    write_texts(tmp_path / "in", texts)
    proc = linstream(
        "embed", "--input", "in", "--output", "out", "--checkpoint-dir", "ckpt",
        "--model", tiny_model_path, "--backend", "numpy", "--chunk-tokens", "64",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return tmp_path, texts


def _records(tmp_path, *args: str) -> dict[str, dict]:
    proc = linstream("results", "inspect", "out", "--json", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return {r["seq_id"]: r for r in map(json.loads, proc.stdout.splitlines())}


def test_inspect_says_per_sequence_what_the_results_hold(job):
    tmp_path, texts = job
    results = read_results(str(tmp_path / "out"))  # the results as the library reads them
    with_store = _records(tmp_path, "--checkpoint-dir", "ckpt")
    assert set(with_store) == set(texts)
    for seq_id, text in texts.items():
        rec = with_store[seq_id]
        n = -(-len(text) // 64)
        assert (rec["chunks"], rec["first_chunk"], rec["last_chunk"]) == (n, 0, n - 1)
        assert (rec["gaps"], rec["missing"], rec["duplicates"]) == (0, [], 0)
        assert (rec["tokens"], rec["final"]) == (len(text), True)
        norms = [np.linalg.norm(results[(seq_id, i)][1].astype(np.float64)) for i in range(n)]
        # the same float32 vectors, the norm taken in float64 both times: equal but for the
        # order of the sum (a few ulps of float64)
        np.testing.assert_allclose(
            [rec["norm_min"], rec["norm_mean"], rec["norm_max"]],
            [min(norms), np.mean(norms), max(norms)],
            rtol=1e-12,
        )
    # Without the store: what the rows alone tell.
    alone = _records(tmp_path)["long.txt"]
    last_start = results[("long.txt", alone["last_chunk"])][0]
    assert (alone["tokens"], alone["tokens_at_least"], alone["final"]) == (
        None,
        last_start + 1,
        None,
    )
    table = linstream("results", "inspect", "out", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:4] == ["sequence", "chunks", "range", "gaps"]
    assert any(ln.startswith("long.txt") and " 0..14 " in ln for ln in table.stdout.splitlines())


def test_inspect_counts_a_lost_row_as_a_gap_and_an_appended_run_as_duplicates(job, tiny_model_path):
    tmp_path, _texts = job
    (part,) = (tmp_path / "out" / "results").glob("*.parquet")
    rows = pq.read_table(part)
    keep = pc.invert(
        pc.and_(pc.equal(rows["seq_id"], "long.txt"), pc.equal(rows["chunk_index"], 3))
    )
    pq.write_table(rows.filter(keep), part)  # chunk 3 of long.txt lost
    rec = _records(tmp_path)["long.txt"]
    assert (rec["gaps"], rec["missing"], rec["chunks"]) == (1, [3], 14)
    again = linstream(
        "embed", "--input", "in", "--output", "out", "--output-mode", "append",
        "--model", tiny_model_path, "--backend", "numpy", "--chunk-tokens", "64", cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    rec = _records(tmp_path)["long.txt"]
    assert (rec["gaps"], rec["chunks"], rec["duplicates"]) == (0, 15, 14)


def test_plot_draws_each_sequences_chunk_to_chunk_similarity(job):
    from PIL import Image

    tmp_path, _texts = job
    proc = linstream("results", "inspect", "out", "--plot", "sim.png", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "plot of 2 sequence(s) written to sim.png" in proc.stderr
    with Image.open(tmp_path / "sim.png") as im:
        assert im.format == "PNG" and im.size == (1000, 500)
        pixels = np.asarray(im.convert("RGB")).reshape(-1, 3)
    white = (pixels == 255).all(axis=1)
    assert 0.01 < 1 - white.mean() < 0.5, "a blank (or filled) plot"
    colours = {tuple(p) for p in pixels[~white][::7]}
    assert len(colours) > 20  # two coloured curves, axes, text (antialiased)
    missing = linstream("results", "inspect", "nowhere", cwd=tmp_path)
    assert missing.returncode == 2 and "no result files under nowhere/results" in missing.stderr


def test_the_results_folder_itself_reads_as_its_output_folder_and_a_wrong_one_is_one_line(job):
    """`results inspect out/results` (the folder the summary line names) reads the same rows
    as `results inspect out`; a folder without results is one line and exit 2."""
    tmp_path, texts = job
    whole = linstream("results", "inspect", "out", "--json", cwd=tmp_path)
    inner = linstream("results", "inspect", "out/results/", "--json", cwd=tmp_path)
    assert whole.returncode == inner.returncode == 0, (whole.stderr, inner.stderr)
    assert inner.stdout == whole.stdout and len(inner.stdout.splitlines()) == len(texts)
    wrong = linstream("results", "inspect", "in", cwd=tmp_path)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.splitlines() == [
        "linstream results: no result files under in/results (OUTPUT: the job's --output folder)"
    ]
