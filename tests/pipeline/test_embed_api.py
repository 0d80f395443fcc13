"""The one-line API as a user meets it: `from linstream.pipeline import embed` (and `Resumable`),
compared with what `linstream embed` writes for the same input, bit for bit; a checkpoint
folder shared both ways; no Beam import; a progress bar on a terminal only; bounded memory."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.cli import linstream, write_texts
from linstream.pipeline import DeadLetterError, Resumable, embed

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TEXTS = {
    "a.txt": "linear attention carries its state from chunk to chunk. " * 9,
    "notes/b.md": "é and ü, in UTF-8 " * 7,
    "c.txt": "short",
}


def _cli_results(tmp_path: Path, model: str, *args: str) -> pa.Table:
    out = tmp_path / f"cli-{len(list(tmp_path.iterdir()))}"
    proc = linstream(
        "embed",
        "--input",
        "in",
        "--output",
        str(out),
        "--model",
        model,
        "--backend",
        "numpy",
        "--chunk-tokens",
        "64",
        *args,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    return pq.read_table(out / "results").sort_by(
        [("seq_id", "ascending"), ("chunk_index", "ascending")]
    )


@pytest.mark.parametrize("emit", ["mean", "last", "tokens", "sequence"])
def test_embed_returns_what_linstream_embed_writes(tmp_path, tiny_model_path, emit):
    write_texts(tmp_path / "in", TEXTS)
    cli = _cli_results(tmp_path, tiny_model_path, "--emit", emit)
    got = embed(
        tmp_path / "in", tiny_model_path, emit=emit, chunk_tokens=64, backend="numpy", as_table=True
    )
    got = got.sort_by([("seq_id", "ascending"), ("chunk_index", "ascending")])
    assert got.schema == cli.schema
    assert got.equals(cli), (got.to_pydict(), cli.to_pydict())  # bit for bit
    if emit == "sequence":  # the plain form: one row per sequence, in the folder's order
        vectors = embed(tmp_path / "in", tiny_model_path, chunk_tokens=64, backend="numpy")
        order = sorted(TEXTS)
        expect = np.stack([np.asarray(v) for v in cli.column("embedding").to_pylist()])
        rows = {s: i for i, s in enumerate(cli.column("seq_id").to_pylist())}
        np.testing.assert_array_equal(vectors, expect[[rows[s] for s in order]])
        assert vectors.dtype == np.float32 and vectors.shape == (3, 16)


def test_texts_lists_mappings_and_token_ids(tiny_model_path):
    one = embed("a text", tiny_model_path, backend="numpy")
    assert one.shape == (16,)
    two = embed(["a text", "another"], tiny_model_path, backend="numpy")
    np.testing.assert_array_equal(two[0], one)
    ids = embed(
        {"x": "a text", "y": [97, 32, 116]}, tiny_model_path, backend="numpy", as_table=True
    )
    assert ids.column("seq_id").to_pylist() == ["x", "y"]
    by_bytes = embed(np.frombuffer(b"a text", np.uint8).astype(np.int32), tiny_model_path)
    np.testing.assert_allclose(by_bytes, one, rtol=0, atol=1e-6)  # the byte tokenizer's ids


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ("", "sequence '0': an empty text"),
        (["ok", [1, 300]], "sequence '1': "),
        ({"a": "x", "b": ""}, "sequence 'b': an empty text"),
        (3.5, "expected a text, a path"),
    ],
)
def test_bad_input_raises_naming_the_sequence(tiny_model_path, inputs, words):
    with pytest.raises((ValueError, TypeError), match=words.replace("(", r"\(")):
        embed(inputs, tiny_model_path, backend="numpy")


def test_a_binary_file_is_a_dead_letter_and_two_files_of_one_name_are_refused(
    tmp_path, tiny_model_path
):
    """A binary file among good ones: by default the call raises, naming it, once the good
    files ran (their result rides on the error); asked for, the dead letters come back beside
    the result.  Two inputs of one id are refused before any work."""
    write_texts(tmp_path / "in", {"a.txt": "text", "x/a.txt": "more"})
    (tmp_path / "in" / "tool").write_bytes(b"\x7fELF\x00\x01")
    with pytest.raises(
        DeadLetterError, match=r"dead letters: 1 \(not_text 1\): .*/in/tool: expected a text file"
    ) as raised:
        embed(tmp_path / "in", tiny_model_path)
    assert [(d.seq_id, d.reason) for d in raised.value.dead_letters] == [("tool", "not_text")]
    assert raised.value.result.shape == (2, 16)
    vectors, dead = embed(tmp_path / "in", tiny_model_path, return_dead_letters=True)
    np.testing.assert_array_equal(vectors, raised.value.result)
    assert dead == raised.value.dead_letters
    clean, none = embed(tmp_path / "in" / "a.txt", tiny_model_path, return_dead_letters=True)
    np.testing.assert_array_equal(clean, vectors[:1])
    assert none == []
    with pytest.raises(ValueError, match=r"two inputs have the id 'a\.txt'"):
        embed([tmp_path / "in" / "a.txt", tmp_path / "in" / "x" / "a.txt"], tiny_model_path)


_NO_BEAM = """
import sys
from linstream.pipeline import Resumable, embed
v = embed(["one", "two"], sys.argv[1], backend="numpy")
with Resumable(sys.argv[2], sys.argv[1], backend="numpy") as r:
    r.embed({"s": "three"})
print(v.shape, "apache_beam" in sys.modules)
"""


def test_the_api_imports_no_beam(tmp_path, tiny_model_path):
    proc = subprocess.run(
        [sys.executable, "-c", _NO_BEAM, tiny_model_path, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["(2,", "16)", "False"], proc.stdout
    assert proc.stderr == ""  # stderr is no terminal here: no progress bar


_BAR = """
import sys
from linstream.pipeline import embed
embed(["x" * 5000], sys.argv[1], backend="numpy", chunk_tokens=100)
"""


def test_a_progress_bar_shows_where_a_terminal_is_attached(tiny_model_path):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    proc = subprocess.Popen(
        [sys.executable, "-c", _BAR, tiny_model_path], stderr=follower, stdout=subprocess.PIPE
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        shown += data
    assert proc.wait(timeout=300) == 0
    os.close(leader)
    text = shown.decode(errors="replace")
    assert "linstream.embed" in text and "5.00k/5.00k" in text, text


_PEAKS = """
import json, sys, tracemalloc
from pathlib import Path

import numpy as np
from linstream.ops import load_model
from linstream.pipeline import embed

model_path, folder = sys.argv[1], Path(sys.argv[2])
model = load_model(model_path)
warm = folder / "warm.txt"
warm.write_text("warm up")  # the first file read imports the reader (Beam's filesystems)
embed(warm, model, backend="numpy")
rng = np.random.default_rng(3)
peaks = []
for size in (1 << 18, 1 << 20):
    path = folder / f"long-{size}.txt"
    path.write_bytes(rng.choice(list(b"abcdefgh \\n"), size=size).astype(np.uint8).tobytes())
    tracemalloc.start()
    vec = embed(path, model, backend="numpy", chunk_tokens=512)
    peaks.append(tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
    assert vec.shape == (1, 16) and np.isfinite(vec).all(), vec
print(json.dumps(peaks))
"""


def test_a_long_file_is_read_one_chunk_at_a_time(tmp_path, tiny_model_path):
    """Memory stays bounded by a chunk, not by the file: the peak of what the call allocates
    hardly moves from a 256 KiB to a 1 MiB file (read whole, the larger file's ids alone would add
    4 MiB).  Measured in a process of its own (seed 3):
    tracemalloc counts every thread's allocations, and in the test process the Beam jobs of
    earlier tests leave threads that allocate while it measures."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", _PEAKS, tiny_model_path, str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"seed 3, peaks {peaks}")
    # Read whole, the larger file's ids alone (4 bytes a token) would put its peak 4 MiB up, and
    # 3 MiB above the smaller file's: half of each fails such a read.  (A ratio of the two peaks
    # was not a bound: the chunk-sized peaks move by ~0.2 MB with the runtime's helper threads.)
    assert peaks[1] - peaks[0] < 1.5 * (1 << 20) and peaks[1] < 2 << 20, peaks


class _StopsAfter:
    """The model, failing after ``n`` chunks (a call stopped mid-way, as by Ctrl-C)."""

    def __init__(self, model, n):
        self._model, self._left = model, n

    def __getattr__(self, name):
        return getattr(self._model, name)

    def embed_chunk(self, *args, **kwargs):
        if self._left == 0:
            raise KeyboardInterrupt
        self._left -= 1
        return self._model.embed_chunk(*args, **kwargs)


def test_a_checkpoint_folder_serves_the_api_and_the_command_both_ways(tmp_path, tiny_model_path):
    from linstream.ops import load_model

    text = "one long document, cut in chunks of 64 bytes. " * 12  # 552 bytes: 9 chunks
    write_texts(tmp_path / "in", {"doc.txt": text})
    whole = _cli_results(tmp_path, tiny_model_path, "--emit", "mean")
    model = load_model(tiny_model_path)
    # A call stopped after 5 chunks; its commits (every 2 chunks) hold 4.
    api = Resumable(
        tmp_path / "ckpt",
        _StopsAfter(model, 5),
        emit="mean",
        chunk_tokens=64,
        backend="numpy",
        checkpoint_every=2,
    )
    with pytest.raises(KeyboardInterrupt):
        api.embed(tmp_path / "in")
    api.close()
    # linstream embed --resume continues it: chunks 4..8, bit-equal to one uninterrupted run.
    rest = _cli_results(
        tmp_path, tiny_model_path, "--emit", "mean", "--checkpoint-dir", "ckpt", "--resume"
    )
    assert rest.column("chunk_index").to_pylist() == list(range(4, 9))
    assert rest.equals(whole.slice(4))
    # ... and a call continues what the command started, and says so when the input changed.
    write_texts(tmp_path / "in2", {"doc.txt": text[:300]})  # chunks 0-3 and a final chunk 4
    started = linstream(
        "embed",
        "--input",
        "in2",
        "--output",
        "o2",
        "--model",
        tiny_model_path,
        "--backend",
        "numpy",
        "--chunk-tokens",
        "64",
        "--checkpoint-dir",
        "ck2",
        "--emit",
        "sequence",
        cwd=tmp_path,
    )
    assert started.returncode == 0, started.stderr
    with Resumable(tmp_path / "ck2", tiny_model_path, chunk_tokens=64, backend="numpy") as again:
        with pytest.raises(
            ValueError,
            match="the input for sequence 'doc.txt' changed since its "
            r"checkpoint \(chunk 4 differs",
        ):
            again.embed(tmp_path / "in")
        vec = again.embed(tmp_path / "in2")  # finished: its mean comes from the checkpoint
    written = pq.read_table(tmp_path / "o2" / "results").column("embedding").to_pylist()
    np.testing.assert_array_equal(vec[0], np.asarray(written[0], np.float32))
