"""`linstream embed` on Prism, Beam's Go runner and the Python SDK's default local runner, as a
user runs it: as README writes it (`--runner=PrismRunner`, nothing else) on a machine without
internet whose engines `make test` fetched, and with `--prism_location=<the binary>`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers.engine_jobs import assert_same_results, dead_letters, embed_cmd, run, summary_line
from helpers.engine_servers import need

#: No internet: every HTTP(S) request but those to this machine goes to a closed port on
#: loopback (Beam fetches Prism with urllib, and gRPC reaches the job server directly, as
#: both honour these).
OFFLINE = {
    "https_proxy": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "no_proxy": "localhost,127.0.0.1,::1",
}


def _offline_env(home: Path, engines: str) -> dict[str, str]:
    """A machine without internet and without Beam's own Prism cache (an empty home), whose
    engines cache is ``engines``."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return {**env, **OFFLINE, "HOME": str(home), "LINSTREAM_ENGINES_CACHE": engines}


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


def test_readmes_prism_command_runs_offline_with_the_fetched_engine(case, tiny_model, tmp_path):
    """`--runner=PrismRunner` alone, offline: the Prism that `make test` fetched is found, and
    without -v the job says only linstream's lines (not Prism's log, nor Beam's line when it
    stops the Prism process at exit)."""
    prism = need("prism")
    engines = str(Path(prism).parent.parent)  # <cache>/prism-v<version>/prism
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    cmd = embed_cmd(tiny_model, case.input, out, ckpt, "--runner=PrismRunner")
    output = run(cmd, env=_offline_env(tmp_path / "home", engines))
    print(summary_line(output))
    assert_same_results(case.reference, out, case.chunks)
    assert not (tmp_path / "home" / ".apache_beam").exists(), "Beam downloaded a Prism"
    others = [ln for ln in output.splitlines() if ln.strip() and not ln.startswith("linstream")]
    assert not others, output[-3000:]


def test_without_a_prism_one_line_says_how_to_get_one(case, tiny_model, tmp_path):
    """Offline, with no Prism fetched and none in Beam's cache: exit 2 and one line naming the
    fetch script and --prism_location, not Beam's download error and its traceback."""
    empty = tmp_path / "no-engines"
    empty.mkdir()
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    proc = subprocess.run(
        embed_cmd(tiny_model, case.input, out, ckpt, "--runner=PrismRunner"),
        env=_offline_env(tmp_path / "home", str(empty)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("linstream embed: error: PrismRunner: no Prism binary"), line
    assert "deploy/engines/fetch.sh prism" in line and "--prism_location=PATH" in line, line
    assert str(empty) in line
