"""A benchmark run's tables go to build/bench/<name>.md and stdout, one run per file."""

import helpers.bench_report as bench_report


def test_a_run_replaces_the_last_runs_file_and_its_later_tables_append(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(bench_report, "OUT_DIR", tmp_path / "bench")
    monkeypatch.setattr(bench_report, "_started", set())
    stale = tmp_path / "bench" / "ops.md"
    stale.parent.mkdir()
    stale.write_text("a table from an earlier run\n")

    first = bench_report.report("ops", "| a |\n", header="# Ops\n\nCommand: `x`")
    second = bench_report.report("ops", "\n## widths\n| b |")
    other = bench_report.report("rules", "| c |")

    assert first == second == stale
    assert stale.read_text() == "# Ops\n\nCommand: `x`\n\n| a |\n\n## widths\n| b |\n"
    assert other.read_text() == "| c |\n"
    out = capsys.readouterr().out
    assert "| a |" in out and "| b |" in out and f"(written to {stale})" in out
