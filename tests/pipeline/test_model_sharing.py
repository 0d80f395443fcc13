"""The embed step ships a model spec, never its weights, and loads it once per worker process."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
from apache_beam.internal import pickler
from helpers.models import write_tiny_model
from helpers.pipelines import run_transform
from linstream.ops import load_model
from linstream.pipeline import Chunk, EmbedSequences
from linstream.pipeline.stage.dofn import SequenceDoFn
from linstream.pipeline.stage.sequence_stage import SequenceStage
from linstream.pipeline.stage.steps import EmbedStep

pytestmark = pytest.mark.e2e  # whole jobs, subprocesses or servers: `make check` leaves it out


def _graph_bytes(transform) -> int:
    """The bytes of the DoFn the transform ships to the workers (what its expand() applies)."""
    return len(pickler.dumps(SequenceDoFn(SequenceStage(transform.step, transform.config))))


def test_a_loaded_builtin_model_ships_as_its_name_not_its_weights():
    model = load_model("builtin:default")
    weight_bytes = sum(w.nbytes for w in model.weights.values())
    by_name = _graph_bytes(EmbedSequences("builtin:default"))
    loaded = _graph_bytes(EmbedSequences(model))
    # Both carry the same spec; the weights (hundreds of KB) stay out of the graph.
    assert loaded < by_name + 1024 and loaded < weight_bytes / 10, (loaded, by_name, weight_bytes)


def test_a_loaded_model_from_an_url_ships_as_the_url(tmp_path):
    path = write_tiny_model(str(tmp_path / "m.safetensors"))
    url = "memory://models/tiny.safetensors"
    with open(path, "rb") as f:
        fsspec.filesystem("memory").pipe_file("/models/tiny.safetensors", f.read())
    step = pickler.loads(pickler.dumps(EmbedStep(load_model(url))))
    assert step._source == url and step._model is None
    step.setup()
    assert step.model.fingerprint == load_model(path).fingerprint


def test_a_loaded_model_from_a_local_file_ships_as_safetensors_bytes(tmp_path):
    path = write_tiny_model(str(tmp_path / "m.safetensors"))
    model = load_model(path)
    step = pickler.loads(pickler.dumps(EmbedStep(model)))
    assert isinstance(step._source, bytes) and step._source[:8] != b"\x80\x04\x95"  # no pickle
    step.setup()
    assert step.model.fingerprint == model.fingerprint


def test_a_model_file_changed_after_the_job_was_built_is_refused(tmp_path):
    path = str(tmp_path / "m.safetensors")
    write_tiny_model(path, seed=1)
    shipped = pickler.dumps(EmbedStep(path))
    write_tiny_model(path, seed=2)  # replaced before the workers start
    step = pickler.loads(shipped)
    with pytest.raises(ValueError, match="changed after the job was built"):
        step.setup()


def test_the_model_loads_once_per_process_for_every_dofn_instance(tmp_path, monkeypatch):
    import linstream.ops

    path = write_tiny_model(str(tmp_path / "m.safetensors"), seed=5)
    loads = []
    real = linstream.ops.load_model

    def counting(source, **kw):
        loads.append(source)
        return real(source, **kw)

    chunks = [
        Chunk(f"s{s}", i, np.arange(4, dtype=np.int32) + s, final=i == 2)
        for s in range(4)
        for i in range(3)
    ]
    transform = EmbedSequences(path, backend="numpy")
    monkeypatch.setattr(linstream.ops, "load_model", counting)
    run = run_transform(
        chunks, transform, tmp_path, ["--runner=FnApiRunner", "--direct_num_workers=2"]
    )
    assert run.dead == [] and len(run.results) == len(chunks)
    assert loads == [path], loads
