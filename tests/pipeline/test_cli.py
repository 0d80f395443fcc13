"""The `linstream` command as a user meets it: help, version, errors, exit codes, text input.

Every case runs the installed `linstream` script in a subprocess and asserts on its exit status,
its stdout/stderr lines and the files it wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from helpers.cli import linstream, one_error_line, write_texts
from linstream.pipeline.io import read_dead_letters, read_results

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

_NO_BEAM = """
import sys
from linstream.pipeline.app.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print("IMPORTED-BEAM" if "apache_beam" in sys.modules else "NO-BEAM")
"""


def test_help_and_checkpoint_commands_import_no_beam(tmp_path):
    for argv in (["--help"], ["checkpoint", "inspect", str(tmp_path)], ["checkpoint", "--help"]):
        proc = subprocess.run(
            [sys.executable, "-c", _NO_BEAM, *argv], capture_output=True, text=True, check=False
        )
        assert proc.stdout.strip().splitlines()[-1] == "NO-BEAM", (argv, proc.stdout)


def test_version_and_help_show_every_default():
    from importlib.metadata import version

    proc = linstream("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"linstream {version('linstream')}"
    from linstream.pipeline.app.cli import _DefaultsFormatter, build_parser

    parser = build_parser("embed")
    commands = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in ("embed", "sample", "demo"):
        fmt = _DefaultsFormatter(name)
        for action in commands[name]._actions:
            if action.dest in ("help", "verbose") or action.required:
                continue
            assert action.help, (name, action.option_strings)
            if action.nargs != 0:
                assert "default" in fmt._get_help_string(action), (name, action.option_strings)
    text = linstream("embed", "--help").stdout
    assert "--checkpoint-dir PATH, --checkpoint_dir PATH" in text
    assert "(default: 2048)" in text and "(default: mean)" in text


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["embed", "--output", "o"], "--input is required"),
        (["embed", "--input", "missing/", "--output", "o"], "missing/: no such file or folder"),
        (["embed", "--input", "in", "--output", "o", "--model", "builtin:nope"], "unknown built"),
        (
            ["embed", "--input", "in", "--output", "o", "--model", "no.safetensors"],
            "no.safetensors",
        ),
        (
            ["embed", "--input", "in", "--output", "o", "--resume"],
            "--resume needs --checkpoint-dir",
        ),
        (
            ["embed", "--input", "in", "--output", "o", "--checkpoint_dirr", "c"],
            "unknown option --checkpoint_dirr; did you mean --checkpoint_dir?",
        ),
        (["embed", "--input", "in", "--output", "o", "--emit", "all"], "invalid choice: 'all'"),
        (["embed", "--input", "in", "--output", "o", "--chunk-tokens", "-1"], "whole number >= 1"),
        (["embed", "--input", "in", "--output", "o", "--max-dead-letters", "x"], "none, a count"),
        (["embed", "--input", "in"], "the following arguments are required: --output"),
        (["embed", "--input", "in", "--output", "o", "--direct_num_workers"], "expected one arg"),
        (["checkpoint", "inspect", "nowhere"], "no checkpoint store at nowhere"),
        (["sample", "--output", "o", "--bogus"], "unrecognized arguments: --bogus"),
        (["embed", "--input", "in/bad.parquet", "--output", "o"], "not a readable Parquet file"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(tmp_path, monkeypatch, capsys, argv, expected):
    """In-process `main(argv)` (the script's entry point), stderr as the user sees it."""
    from linstream.pipeline.app.cli import main

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello")
    (tmp_path / "in" / "bad.parquet").write_bytes(b"not parquet")
    monkeypatch.chdir(tmp_path)
    try:
        rc = main(argv)
    except SystemExit as ex:  # argparse's own errors leave through sys.exit
        rc = ex.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0] and lines[0].startswith("linstream"), lines[0]
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").rglob("*.parquet"))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["embed", "--input", "missing/", "--output", "o"], "missing/: no such file or folder"),
        (["embed", "--input", "in", "--output", "o", "--checkpoint_dirr", "c"], "did you mean"),
        (["embed", "--input", "in", "--output", "o", "--chunk-tokens", "0"], "whole number"),
    ],
)
def test_the_installed_command_refuses_with_one_line(tmp_path, argv, expected):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello")
    proc = linstream(*argv, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert expected in one_error_line(proc)


def test_no_gpu_for_cupy_is_a_usage_error(tmp_path):
    from linstream.ops.backend import cupy_unavailable_reason

    if cupy_unavailable_reason() is None:
        pytest.skip("a GPU is present: --backend cupy is valid here")
    write_texts(tmp_path / "in", {"a.txt": "x"})
    proc = linstream("embed", "--input", "in", "--output", "o", "--backend", "cupy", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--backend cupy: no usable GPU here" in one_error_line(proc)


def test_verbose_shows_the_traceback(tmp_path):
    proc = linstream("embed", "--input", "in", "--output", "o", "--model", "builtin:x", "-v")
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "unknown built-in model" in proc.stderr


def test_embed_a_text_folder_in_one_command_and_read_it_back(tmp_path, tiny_model_path):
    rng = np.random.default_rng(7)
    print("seed 7")
    texts = {
        "notes/a.txt": "".join(rng.choice(list("abcdefgh \n"), size=300)),
        "b.md": "linear attention carries (S, z) from chunk to chunk. é",
    }
    write_texts(tmp_path / "my-texts", texts)
    (tmp_path / "my-texts" / "empty.txt").write_text("")
    proc = linstream(
        "embed",
        "--input",
        "my-texts",
        "--output",
        "out",
        "--model",
        tiny_model_path,
        "--backend",
        "numpy",
        "--chunk-tokens",
        "64",
        "--checkpoint_dir",  # the underscore spelling means the same
        "ckpt",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "dead letters: 1 (empty_sequence 1) in out/dead_letters/" in proc.stdout
    results = read_results(str(tmp_path / "out"))
    from linstream.ops import load_model

    model = load_model(tiny_model_path)
    for seq_id, text in texts.items():
        tokens = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
        states = model.initial_states()
        n = -(-len(tokens) // 64)
        assert sorted(i for s, i in results if s == seq_id) == list(range(n))
        for i in range(n):
            emb, states = model.embed_chunk(tokens[i * 64 : (i + 1) * 64], states)
            start, got = results[(seq_id, i)]
            assert start == i * 64
            # Same float32 kernels on the same data: equal up to float32 rounding of the mean.
            tol = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(emb).max()))
            np.testing.assert_allclose(got, emb.mean(axis=0), rtol=0, atol=tol)
    assert [d["reason"] for d in read_dead_letters(str(tmp_path / "out"))] == ["empty_sequence"]
    from linstream.state import CheckpointStore

    assert sorted(CheckpointStore(str(tmp_path / "ckpt")).sequences()) == ["b.md", "notes/a.txt"]
    proc = linstream("checkpoint", "inspect", "ckpt", "--json", cwd=tmp_path)
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert proc.returncode == 0 and {r["seq_id"] for r in rows} == {"b.md", "notes/a.txt"}
    done = {r["seq_id"]: r["position"] for r in rows}
    assert done == {k: len(v.encode()) for k, v in texts.items()}
    proc = linstream("checkpoint", "gc", "ckpt", "--grace-seconds", "0", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("file(s) under ckpt")


def test_dead_letter_rules_exit_3(tmp_path, tiny_model_path):
    rows = [{"id": f"s{i}", "tokens": [1, 2, 3]} for i in range(3)] + [{"id": "x"}]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", tiny_model_path, "--backend", "numpy", "--output"]
    ok = linstream("embed", "--input", "ids.jsonl", *common, "o1", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "dead letters: 1 (bad_input_row 1)" in ok.stdout
    strict = linstream(
        "embed", "--input", "ids.jsonl", *common, "o2", "--max-dead-letters", "0", cwd=tmp_path
    )
    assert strict.returncode == 3, strict.stderr
    assert "1 dead letter(s) exceed --max-dead-letters 0" in one_error_line(strict)
    pct = linstream(
        "embed", "--input", "ids.jsonl", *common, "o3", "--max-dead-letters", "30%", cwd=tmp_path
    )
    assert pct.returncode == 0, pct.stderr  # 1 of 4 = 25%
    bad = [{"id": f"s{i}", "tokens": [999, 1000]} for i in range(2)]  # past the vocabulary
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad))
    dead = linstream("embed", "--input", "bad.jsonl", *common, "o4", cwd=tmp_path)
    assert dead.returncode == 3, dead.stderr
    assert "all 2 input chunk(s) or row(s) went to the dead letters" in one_error_line(dead)


def test_a_stale_temporary_folder_is_removed_and_said(tmp_path, tiny_model_path):
    write_texts(tmp_path / "in", {"a.txt": "abc"})
    for stale in ("out/.temp1234", "out/results/.temp-x", "out/beam-temp-dead_letters-1"):
        (tmp_path / stale).mkdir(parents=True)
        (tmp_path / stale / "part").write_bytes(b"torn")
    proc = linstream(
        "embed", "--input", "in", "--output", "out", "--model", tiny_model_path, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "removed 3 stale temporary folder(s) left under out by a stopped job" in proc.stderr
    left = [p for p in (tmp_path / "out").rglob("*") if "temp" in p.name]
    assert left == []


def test_linstream_options_read_both_spellings_and_stay_json():
    from apache_beam.options.pipeline_options import PipelineOptions
    from linstream.pipeline.app.options import LinstreamOptions

    argv = ["--checkpoint_dir=gs://b/c", "--resume=true", "--chunk-tokens=512", "--streaming"]
    opts = PipelineOptions(argv).view_as(LinstreamOptions)
    assert (opts.checkpoint_dir, opts.resume, opts.chunk_tokens) == ("gs://b/c", True, 512)
    assert (
        PipelineOptions(["--checkpoint-dir", "x"]).view_as(LinstreamOptions).checkpoint_dir == "x"
    )
    everything = PipelineOptions([*argv, "--max_dead_letters=5%"]).get_all_options()
    assert everything["max_dead_letters"] == "5%"
    json.dumps(everything)  # Dataflow ships all options to the workers as JSON


def test_progress_line_shows_total_rate_and_eta():
    from linstream.pipeline.stage.progress import Progress

    now = [100.0]
    lines: list[str] = []
    p = Progress(10.0, total_tokens=10_000, clock=lambda: now[0], log=lines.append)
    now[0] = 105.0
    p.add(1000)  # 5 s: not yet
    now[0] = 110.0
    p.add(1000)  # 2000 tokens in 10 s: 200 tokens/s, 8000 left: 40 s
    assert lines == ["linstream: 2,000 / 10,000 tokens (20.0%) in 2 chunks, 200 tokens/s, ETA 40 s"]
    assert Progress(None).line().startswith("linstream: 0 tokens in 0 chunks")


def test_a_cold_numba_cache_is_announced_before_the_first_kernel_call(tmp_path, tiny_model_path):
    import signal
    import time

    from helpers.cli import start

    write_texts(tmp_path / "in", {"a.txt": "abc" * 50})
    proc = start(
        "embed",
        "--input",
        "in",
        "--output",
        "out",
        "--model",
        tiny_model_path,
        "--backend",
        "numba",
        cwd=tmp_path,
        env={"NUMBA_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert proc.stderr is not None
    t0 = time.monotonic()
    line = proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)  # no need to wait for the compile
    _out, err = proc.communicate(timeout=120)
    assert line.startswith("linstream embed: compiling the Numba kernels for this machine"), line
    assert time.monotonic() - t0 < 60
    assert proc.returncode in (0, 143) and "Traceback" not in err, err


def test_a_restore_failed_dead_letter_exits_3(tmp_path, tiny_model_path):
    """A sequence whose newest checkpoint is corrupt cannot continue: its chunks are dead
    letters (restore_failed) and the job exits 3 even with no --max-dead-letters."""
    from linstream.pipeline.app.sample import sample_chunks
    from linstream.pipeline.io import write_chunk_file

    chunks = sample_chunks(1, 512, 64, seed=3, vocab_size=256)
    write_chunk_file(str(tmp_path / "a.parquet"), [c for c in chunks if c.index < 4])
    write_chunk_file(str(tmp_path / "b.parquet"), [c for c in chunks if c.index >= 4])
    common = ["--model", tiny_model_path, "--backend", "numpy", "--checkpoint-dir", "ckpt"]
    first = linstream(
        "embed",
        "--input",
        "a.parquet",
        "--output",
        "o1",
        *common,
        "--checkpoint-every",
        "2",
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    data = sorted((tmp_path / "ckpt").rglob("*.arrow"))
    assert data, "no checkpoint data file was written"
    newest = data[-1]
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the tensor data
    newest.write_bytes(bytes(raw))
    second = linstream(
        "embed", "--input", "b.parquet", "--output", "o2", *common, "--resume", cwd=tmp_path
    )
    assert second.returncode == 3, (second.stdout, second.stderr)
    assert "restore_failed" in second.stdout
    assert "went to the dead letters as restore_failed" in one_error_line(second)


def test_a_resume_with_nothing_left_to_do_exits_0(tmp_path, tiny_model_path):
    """Resume "as often as needed": a second --resume over the same input, whose chunks were all
    applied by the first job, exits 0 although one input row is bad (its dead letter is written
    again); the skipped chunks are no dead letters. A job whose only rows are bad still exits 3."""
    rows = [{"id": f"s{i}", "tokens": list(range(1, 40))} for i in range(3)] + [{"id": "x"}]
    (tmp_path / "ids.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", tiny_model_path, "--backend", "numpy", "--checkpoint-dir", "ckpt"]
    common += ["--input", "ids.jsonl", "--chunk-tokens", "8"]
    first = linstream("embed", *common, "--output", "o1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "15 chunks" in first.stdout and "dead letters: 1 (bad_input_row 1)" in first.stdout
    for _ in range(2):
        again = linstream("embed", *common, "--output", "o2", "--resume", cwd=tmp_path)
        assert again.returncode == 0, (again.stdout, again.stderr)
        assert "0 chunks" in again.stdout and "duplicates 15" in again.stdout, again.stdout
        assert "dead letters: 1 (bad_input_row 1)" in again.stdout
        assert "exit 3" not in again.stderr
    assert read_results(str(tmp_path / "o2")) == {}
    (tmp_path / "bad.jsonl").write_text('{"id": "y", "tokens": [999]}\n{"id": "z"}\n')
    bad = linstream(
        "embed", *common[:-4], "--input", "bad.jsonl", "--output", "o3", "--resume", cwd=tmp_path
    )
    assert bad.returncode == 3, bad.stderr  # 999 is past the vocabulary: unknown_token
    assert "all 2 input chunk(s) or row(s) went to the dead letters" in one_error_line(bad)


def test_a_binary_file_is_a_not_text_dead_letter_unless_text_is_asked_for(
    tmp_path, tiny_model_path
):
    """Under --input-format auto a file that is not UTF-8 text (an executable, a picture, a
    Latin-1 file) is one `not_text` dead letter naming it; --input-format text embeds it."""
    texts = {"a.txt": "plain text, é and ü in UTF-8 " * 20}
    write_texts(tmp_path / "in", texts)
    (tmp_path / "in" / "tool").write_bytes(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4)
    (tmp_path / "in" / "latin1.txt").write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    # A multi-byte character cut by the 8 KiB window is still text.
    (tmp_path / "in" / "long.txt").write_text("x" * 8191 + "é" + "y" * 100, encoding="utf-8")
    common = ["--input", "in", "--model", tiny_model_path, "--backend", "numpy"]
    auto = linstream("embed", *common, "--output", "o1", cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    assert "dead letters: 2 (not_text 2) in o1/dead_letters/" in auto.stdout, auto.stdout
    dead = {d["seq_id"]: d for d in read_dead_letters(str(tmp_path / "o1"))}
    assert sorted(dead) == ["latin1.txt", "tool"]
    assert {d["reason"] for d in dead.values()} == {"not_text"}
    assert "a NUL byte at offset 7" in dead["tool"]["message"]
    assert "not UTF-8 at offset 3" in dead["latin1.txt"]["message"]
    assert "--input-format text" in dead["tool"]["message"]
    assert {s for s, _ in read_results(str(tmp_path / "o1"))} == {"a.txt", "long.txt"}
    text = linstream("embed", *common, "--input-format", "text", "--output", "o2", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "dead letters: none" in text.stdout
    got = {s for s, _ in read_results(str(tmp_path / "o2"))}
    assert got == {"a.txt", "long.txt", "latin1.txt", "tool"}


@pytest.mark.parametrize("command", ["sample", "demo"])
def test_chunk_tokens_is_one_name_across_commands_and_chunk_size_an_old_one(command, tmp_path):
    """`sample` and `demo` take `--chunk-tokens` as `embed` does; `--chunk-size` still works,
    with one warning line naming the new spelling, and --help says it is deprecated."""
    for cmd in (command, "embed"):
        shown = " ".join(linstream(cmd, "--help").stdout.split())
        assert "--chunk-tokens N" in shown, (cmd, shown)
        if cmd != "embed":
            assert "--chunk-size N deprecated: the old name of --chunk-tokens" in shown, shown
    if command == "demo":
        return  # the demo runs three jobs; its flag is the same _chunk_tokens as sample's
    args = ["sample", "--sequences", "1", "--tokens", "100", "--vocab-size", "50"]
    new = linstream(*args, "--chunk-tokens", "32", "--output", "new", cwd=tmp_path)
    old = linstream(*args, "--chunk-size", "32", "--output", "old", cwd=tmp_path)
    assert new.returncode == 0 and old.returncode == 0, (new.stderr, old.stderr)
    assert new.stderr == ""
    assert one_error_line(old) == (
        "linstream sample: warning: --chunk-size is deprecated; use --chunk-tokens (same meaning)"
    )
    assert "wrote 4 chunks (1 sequences x 100 tokens, 32 tokens per chunk)" in old.stdout
    (a,), (b,) = (list((tmp_path / d).glob("*.parquet")) for d in ("new", "old"))
    assert a.read_bytes() == b.read_bytes()


def test_the_python_transforms_and_the_command_share_their_defaults():
    """`EmbedSequences(model)`, `ToChunks()` and `InputConfig()` default to what
    `linstream embed` does without flags (one vector per chunk, the mean; 2048-token chunks;
    the same commit interval, buffer bound, idle timeout, state dtype and backend)."""
    import dataclasses

    from linstream.pipeline import EmbedSequences, InputConfig, ToChunks
    from linstream.pipeline.app.cli import build_parser
    from linstream.pipeline.app.options import EmbedConfig

    args, _ = build_parser("embed").parse_known_args(["embed", "--output", "o"])
    cli = EmbedConfig.from_args(args)
    transform = EmbedSequences("builtin:default")
    assert transform.config.emit == cli.emit == "mean"
    # The job's own settings (progress lines, where outputs go) are not the transform's.
    job_only = {"progress_every_s", "output_dir", "total_tokens"}
    for f in dataclasses.fields(transform.config):
        if f.name not in job_only:
            cli_value = getattr(cli.stage_config(), f.name)
            assert getattr(transform.config, f.name) == cli_value, f.name
    assert transform._embed.backend == cli.backend
    assert str(transform._embed.state_dtype) == cli.state_dtype
    assert ToChunks().chunk_tokens == InputConfig().chunk_tokens == cli.chunk_tokens
    assert InputConfig() == dataclasses.replace(cli.input_config(), input=None)


def test_beam_is_quiet_unless_asked_and_v_shows_each_stage(tmp_path, tiny_model_path):
    """Without -v, nothing but linstream's own lines: Beam's import-time warning ("apitools not
    found", printed where the gcp extra is not installed: simulated here by an apitools that
    cannot be imported) is not shown. With -v: that line, Beam's worker logs, and a progress
    line from each stage (files read, sequences cut into chunks, tokens embedded)."""
    shim = tmp_path / "no-apitools" / "apitools"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("not installed")\n')
    env = {"PYTHONPATH": str(shim.parent)}
    write_texts(tmp_path / "in", {"a.txt": "a" * 300, "b/c.txt": "bc" * 100})
    common = ["embed", "--input", "in", "--model", tiny_model_path, "--backend", "numpy"]
    common += ["--chunk-tokens", "64"]
    quiet = linstream(*common, "--output", "o1", cwd=tmp_path, env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", quiet.stderr
    sample = ["sample", "--output", "s", "--sequences", "1", "--tokens", "10", "--vocab-size", "9"]
    sampled = linstream(*sample, cwd=tmp_path, env=env)  # imports Beam too (its I/O)
    assert sampled.returncode == 0 and sampled.stderr == "", sampled.stderr
    loud = linstream(*common, "--output", "o2", "-v", cwd=tmp_path, env=env)
    assert loud.returncode == 0, loud.stderr
    lines = loud.stderr.splitlines()
    assert any("apitools not found" in ln for ln in lines), loud.stderr
    assert "INFO linstream.read: read 2 input file(s), 500 bytes" in lines, loud.stderr
    assert "INFO linstream.read: cut 2 sequence(s) into 9 chunk(s) (500 tokens)" in lines
    staged = [ln for ln in lines if ln.startswith("INFO linstream.pipeline.stage")]
    assert len(staged) == 1 and "500 / 500 tokens (100.0%) in 9 chunks" in staged[0], lines
    assert any(ln.startswith("INFO apache_beam.io.fileio: Moving") for ln in lines), lines
    assert not any("Converting string literal" in ln for ln in lines)


def test_a_resumed_jobs_progress_counts_what_is_left(tmp_path, tiny_model_path):
    """The progress line's 100% is what this job applies: a --resume over the whole input counts
    the tokens its checkpoints do not hold yet, not the input's (which stopped at 37.5%)."""
    from linstream.pipeline.app.sample import sample_chunks
    from linstream.pipeline.io import write_chunk_file

    chunks = sample_chunks(2, 512, 64, seed=4, vocab_size=256)  # 2 x 8 chunks of 64 tokens
    write_chunk_file(str(tmp_path / "first.parquet"), [c for c in chunks if c.index < 3])
    write_chunk_file(str(tmp_path / "all.parquet"), chunks)
    common = ["--model", tiny_model_path, "--backend", "numpy", "--checkpoint-dir", "ckpt"]
    first = linstream(
        "embed", "--input", "first.parquet", "--output", "o1", *common, cwd=tmp_path, timeout=600
    )
    assert first.returncode == 0, first.stderr
    rest = linstream(
        "embed", "--input", "all.parquet", "--output", "o2", *common, "--resume", "-v", cwd=tmp_path
    )
    assert rest.returncode == 0, rest.stderr
    assert "10 chunks, 640 tokens" in rest.stdout and "duplicates 6" in rest.stdout, rest.stdout
    staged = [ln for ln in rest.stderr.splitlines() if ln.startswith("INFO linstream.pipeline")]
    assert len(staged) == 1 and "640 / 640 tokens (100.0%) in 10 chunks" in staged[0], staged
