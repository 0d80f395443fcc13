"""The README's examples run as written: the Python blocks (the PyTorch training block also runs
in tests/ops) and the shell commands of "Bring your own model"."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def _block(word: str) -> str:
    return next(b for b in BLOCKS if word in b and "TorchEmbeddingModel" not in b)


def test_ops_example_continues_a_sequence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_block("causal_linear_attention"), str(README), "exec"), scope)
    assert scope["out"].shape == (1000, 8, 64)
    assert scope["out2"].shape == (3096, 8, 64)
    assert scope["state"].S.dtype == np.float64


def test_pipeline_example_embeds_and_checkpoints(tmp_path, monkeypatch):
    pytest.importorskip("apache_beam")
    from linstream.state import CheckpointStore

    monkeypatch.chdir(tmp_path)
    exec(compile(_block("checkpoint_dir="), str(README), "exec"), {})
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert store.sequences() == ["doc-1"]


def test_to_chunks_example_builds_chunks_from_text_and_ids(tmp_path, monkeypatch):
    pytest.importorskip("apache_beam")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_block("ToChunks("), str(README), "exec"), scope)
    assert {"chunks", "bad_docs", "results", "dead_letters"} <= set(scope)


def _shell_blocks(heading: str) -> list[list[str]]:
    """The command lines (continuations joined) of each ```sh block in README section `heading`."""
    text = README.read_text()
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    return [
        [" ".join(line.split()) for line in b.replace("\\\n", " ").splitlines() if line.strip()]
        for b in blocks
    ]


def test_bring_your_own_model_trains_saves_and_embeds_a_folder(tmp_path, monkeypatch):
    """Train on a folder of text, save with the tokenizer named, embed the folder with
    `linstream embed` as written, read the results with pandas as written; the Dataflow
    command line is accepted by the launcher as written."""
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    block = next(b for b in BLOCKS if "write_model(" in b and "TorchEmbeddingModel" in b)
    scope: dict = {}
    exec(compile(block, str(README), "exec"), scope)
    assert scope["losses"][-1] < scope["losses"][0]
    from linstream.ops.model.weights import read_model_header

    config, named = read_model_header((tmp_path / "my-model.safetensors").read_bytes())
    assert named == "tokenizer.json" and config.vocab_size == scope["tokenizer"].vocab_size

    (embed, read), dataflow = _shell_blocks("Bring your own model")
    argv = shlex.split(embed)
    assert argv[0] == "linstream"
    exe = str(Path(sys.executable).with_name("linstream"))
    proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    from linstream.pipeline.io import read_results

    results = read_results("out")
    n_files = len(list((tmp_path / "my-texts").rglob("*.txt")))
    assert len({seq for seq, _ in results}) == n_files
    first = next(iter(results.values()))[1]
    assert first.shape == (64,)  # --emit mean: one d_model vector per chunk
    # The Dataflow launch as written: the launcher's command line names the gs:// model and
    # input, and every argument is a linstream or a Beam option.
    *_copies, launch = dataflow
    words = shlex.split(launch)
    env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
    env["IMAGE"] = "example.invalid/linstream:1"
    script = ROOT / next(w for w in words if w.endswith("launch.sh"))
    printed = subprocess.run(
        ["bash", str(script)],
        env={**os.environ, **env, "PRINT_ONLY": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    args = printed.stdout.split()[2:]  # python, submit.py, then the arguments
    assert f"--model={env['MODEL']}" in args and f"--input={env['INPUT']}" in args
    from apache_beam.options.pipeline_options import PipelineOptions
    from linstream.pipeline.app.cli import _check_beam_args
    from linstream.pipeline.app.options import LinstreamOptions

    opts = PipelineOptions(args).view_as(LinstreamOptions)
    assert (opts.model, opts.input) == (env["MODEL"], env["INPUT"])
    _check_beam_args(args)  # raises on an argument that is neither

    if not (tmp_path / "out" / "results").is_dir():
        pytest.skip("this tree still writes results beside the dead letters (no out/results/)")
    py = shlex.split(read)
    assert py[:2] == ["python", "-c"]
    shown = subprocess.run([sys.executable, "-c", py[2]], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "seq_id" in shown.stdout and "embedding" in shown.stdout
