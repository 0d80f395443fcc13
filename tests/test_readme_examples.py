"""The README's examples run as written: the Python blocks (the PyTorch training block also runs
in tests/ops), the shell commands of "Bring your own model", and the first commands a newcomer
meets, in order; every install line that brings torch names the constraints, and `make demo`
installs what README's commands import."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out

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
    assert store.sequences() == ["doc-1", "doc-2"]  # both documents, each at its final chunk
    # committed through their final chunks: 20 bytes in chunks of 8, and 4 token ids in one
    assert [max(c.next_chunk or 0 for c in store.commits(s)) for s in ("doc-1", "doc-2")] == [3, 1]


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

    results = read_results("my-out")
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

    if not (tmp_path / "my-out" / "results").is_dir():
        pytest.skip("this tree still writes results beside the dead letters (no out/results/)")
    py = shlex.split(read)
    assert py[:2] == ["python", "-c"]
    shown = subprocess.run([sys.executable, "-c", py[2]], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "seq_id" in shown.stdout and "embedding" in shown.stdout


def test_one_line_api_example_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LINSTREAM_BACKEND", "numpy")  # what backend="auto" picks: no compiling
    (tmp_path / "my-texts" / "notes").mkdir(parents=True)
    (tmp_path / "my-texts" / "a.txt").write_text("some text " * 300)
    (tmp_path / "my-texts" / "notes" / "b.txt").write_text("more")
    scope: dict = {}
    exec(compile(_block("from linstream.pipeline import embed"), str(README), "exec"), scope)
    assert scope["vectors"].shape == (2, 128) and scope["vectors"].dtype == np.float32
    table = scope["table"]
    assert table.column_names == ["seq_id", "chunk_index", "start_position", "embedding"]
    assert table.column("seq_id").to_pylist() == ["a.txt", "a.txt", "notes/b.txt"]


def _indented_blocks(heading: str) -> list[list[str]]:
    """The 4-space indented command blocks of README section `heading`, one list of lines each."""
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks, current = [], []
    for line in section.splitlines():
        if line.startswith("    ") and line.strip():
            current.append(line[4:])
        elif current and not line.strip().startswith("```"):
            blocks.append(current)
            current = []
    return blocks + ([current] if current else [])


def test_readme_commands_run_in_the_order_a_newcomer_meets_them(tmp_path):
    """The first commands a newcomer types, as written, one after another in one folder (with a
    folder of their own texts): embed it, read it with pandas, then the command-line tour.
    `linstream demo` (the tour's last line, what `make demo` runs) runs in tests/pipeline on
    smaller data. The kernels are the NumPy ones (LINSTREAM_BACKEND, which `--backend auto`
    reads), so that no process spends its time compiling."""
    (tmp_path / "my-texts" / "notes").mkdir(parents=True)
    (tmp_path / "my-texts" / "a.txt").write_text("a first text of my own. " * 200)
    (tmp_path / "my-texts" / "notes" / "b.txt").write_text("a second one, é")
    first, *_ = _indented_blocks("Embed your own text in one command")
    tour, *_ = _indented_blocks("The command line")
    *commands, demo = first + tour
    assert demo.split("#")[0].split() == ["linstream", "demo"]
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LINSTREAM_BACKEND": "numpy"}
    for command in commands:
        proc = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, (command, proc.stderr)
        if command.startswith("python -c"):
            assert "seq_id" in proc.stdout and "embedding" in proc.stdout, proc.stdout
    assert (tmp_path / "data-out" / "results").is_dir()


def test_every_install_line_that_brings_torch_carries_the_constraints():
    """An unconstrained torch install pulls gigabytes of CUDA wheels: every `pip install` in
    README and the Makefile that brings torch (its extra, or the test extras) names the file."""
    lines = README.read_text().splitlines() + (ROOT / "Makefile").read_text().splitlines()
    installs = [ln for ln in lines if "pip install" in ln or ("$(PIP)" in ln and "install" in ln)]
    assert installs
    for line in installs:
        for part in re.split(r"(?=pip install)", line):
            if "torch" in part or "test" in part.split("#")[0]:
                assert "-c constraints.txt" in part or "-c $(CONSTRAINTS)" in part, line


def test_make_demo_installs_what_the_readme_commands_import():
    """Every module a `python -c` command of README imports comes with `make demo`'s install:
    linstream's own dependencies or the extras the Makefile's demo target names."""
    import ast
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = re.search(r"^DEMO_EXTRAS\s*:=\s*(.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert extras, "the Makefile names the demo's extras"
    wanted = list(project["dependencies"])
    for extra in extras.group(1).replace(",", " ").split():
        wanted += project["optional-dependencies"][extra]
    names = {re.split(r"[<>=!\[ ;]", w, maxsplit=1)[0].lower().replace("_", "-") for w in wanted}
    which = packages_distributions()
    commands = re.findall(r"python -c '([^']+)'", README.read_text())
    assert commands
    for code in commands:
        for node in ast.walk(ast.parse(code)):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for mod in mods:
                top = mod.split(".")[0]
                if top == "linstream":
                    continue
                dists = {d.lower().replace("_", "-") for d in which.get(top, [])}
                assert dists & names, (top, dists, sorted(names))
