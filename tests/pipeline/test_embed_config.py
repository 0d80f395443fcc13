"""The embed job's options are one typed value, the same whichever way they arrive: the command
line (`linstream embed`'s parser), Beam pipeline options (a Flex Template launcher), or a dict;
each part reaches the reader, the stage and the streaming source as given."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from linstream.pipeline.app.cli import build_parser
from linstream.pipeline.app.flag_values import DeadLetterLimit
from linstream.pipeline.app.options import EMBED_FLAGS, EmbedConfig
from linstream.pipeline.errors import UsageError
from linstream.pipeline.io import InputConfig, StreamConfig
from linstream.pipeline.stage.config import StageConfig

ARGV = [
    "--input=in/",
    "--output",
    "out",
    "--checkpoint_dir=gs://b/c",
    "--resume=true",
    "--chunk-tokens=512",
    "--emit",
    "tokens",
    "--max-buffered-chunks=none",
    "--idle_timeout=5",
    "--max-dead-letters=5%",
    "--progress-every=0",
    "--streaming",
    "--kafka_bootstrap=k:9092",
    "--kafka_topic=a,b",
]
EXPECTED = EmbedConfig(
    input="in/",
    output="out",
    checkpoint_dir="gs://b/c",
    resume=True,
    chunk_tokens=512,
    emit="tokens",
    max_buffered_chunks=None,
    idle_timeout=5.0,
    max_dead_letters=DeadLetterLimit(percent=5.0),
    progress_every=0.0,
    streaming=True,
    stream=StreamConfig(kafka_bootstrap="k:9092", kafka_topic="a,b"),
)


def _command_line(argv: list[str]) -> EmbedConfig:
    args, rest = build_parser("embed").parse_known_args(["embed", *argv])
    assert rest == []
    return EmbedConfig.from_args(args)


def test_the_command_line_pipeline_options_and_a_dict_give_one_config():
    assert _command_line(ARGV) == EXPECTED
    assert EmbedConfig.from_options(PipelineOptions([*ARGV, "--runner=DataflowRunner"])) == EXPECTED
    as_text = {
        "input": "in/",
        "output": "out",
        "checkpoint_dir": "gs://b/c",
        "resume": "true",
        "chunk_tokens": "512",
        "emit": "tokens",
        "max_buffered_chunks": "none",
        "idle_timeout": "5",
        "max_dead_letters": "5%",
        "progress_every": "0",
        "streaming": "true",
        "kafka_bootstrap": "k:9092",
        "kafka_topic": "a,b",
    }
    assert EmbedConfig.from_dict(as_text) == EXPECTED


def test_every_flag_is_a_field_with_the_command_lines_default():
    assert _command_line(["--output", "o"]) == EmbedConfig(output="o")
    assert EmbedConfig.from_options(PipelineOptions(["--output", "o"])) == EmbedConfig(output="o")
    names = [f.dest for f in EMBED_FLAGS]
    assert names[:3] == ["input", "input_format", "id_column"] and len(set(names)) == 29
    assert "output_mode" in names  # what to do with an output folder that holds results


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"emit": "all"}, "--emit: expected one of mean, last, sequence, tokens, got 'all'"),
        ({"checkpoint_every": 0}, "--checkpoint-every: expected a whole number >= 1, got '0'"),
        ({"chunk_tokens": "many"}, "--chunk-tokens: expected a whole number >= 1, got 'many'"),
        ({"resume": "maybe"}, "--resume: expected true or false, got 'maybe'"),
        ({"max_dead_letters": "lots"}, "--max-dead-letters: expected none, a count N"),
        ({"checkpoint_dri": "c"}, "unknown embed option 'checkpoint_dri'"),
    ],
)
def test_a_bad_value_is_one_usage_error_naming_the_flag(values, words):
    with pytest.raises(UsageError) as info:
        EmbedConfig.from_dict({"output": "o", **values})
    assert words in str(info.value)


def test_the_parts_handed_down():
    config = EXPECTED
    assert config.input_config() == InputConfig(input="in/", chunk_tokens=512)
    assert config.stage_config(total_tokens=7) == StageConfig(
        checkpoint_dir="gs://b/c",
        resume=True,
        emit="tokens",
        idle_timeout=5.0,
        output_dir="out",  # with a store, results are written as part of each commit
        total_tokens=7,
    )
    plain = EmbedConfig(output="out", progress_every=2.5).stage_config()
    assert plain.output_dir is None and plain.checkpoint_dir is None  # Beam's sink writes them
    assert plain.progress_every_s == 2.5 and plain.emit == "mean"
