"""`linstream embed` on Prism, Beam's Go runner and the Python SDK's default local runner, as a
user runs it: `--runner=PrismRunner --prism_location=<the binary>` (no download)."""

from __future__ import annotations

from helpers.engine_jobs import assert_same_results, dead_letters, embed_cmd, run, summary_line
from helpers.engine_servers import need


def test_embed_on_prism_equals_fn_api_runner(case, tiny_model, tmp_path):
    prism = need("prism")
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    cmd = embed_cmd(
        tiny_model, case.input, out, ckpt, "--runner=PrismRunner", f"--prism_location={prism}"
    )
    print(summary_line(run(cmd)))
    assert_same_results(case.reference, out, case.chunks)
    assert dead_letters(out) == dead_letters(case.reference)
    assert len(dead_letters(out)) == case.dead_letters
