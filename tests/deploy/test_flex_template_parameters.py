"""The Flex Template declares every job option a template can use (metadata.json), so it cannot
fall behind `linstream embed`'s option table: each launcher option is a parameter (or named
below with the reason it is not), and each parameter's regexes accept the option's choices and
default and nothing its parser would refuse."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest
from linstream.pipeline.app.options import EMBED_FLAGS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METADATA = DEPLOY / "dataflow" / "flex_template" / "metadata.json"

#: Launcher options that are not template parameters, and why.
NOT_PARAMETERS = {
    "max_dead_letters": "judged by `linstream embed` once the job has ended; a template "
    "launcher returns when the job is submitted, so no exit status could carry the verdict",
    "wait": "a Flex Template launcher must return without waiting for the job",
    "output_mode": "the rules for an output folder that holds results are applied where "
    "`linstream embed` launches a job; a template launcher does not look into the folder",
    "threads": "bounds the threads of the processes `linstream embed` runs on its own machine; "
    "Dataflow workers use their machine type's cores",
}

#: Values tried against each parameter's regexes and its option's parser.
PROBES = ["0", "1", "16", "2.5", "300.0", "-1", "1e3", "x", "", " ", "none", "none%", "12%", "true"]


def _launcher_parser() -> argparse.ArgumentParser:
    spec = importlib.util.spec_from_file_location(
        "linstream_deploy_submit_params", DEPLOY / "dataflow" / "submit.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def _options() -> dict[str, argparse.Action]:
    """The launcher's own options by name (Beam's pass through and are not declared)."""
    return {
        a.dest: a
        for a in _launcher_parser()._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    }


def _parameters() -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in json.loads(METADATA.read_text())["parameters"]}


def _matches(param: dict[str, Any], value: str) -> bool:
    return all(re.search(rx, value) for rx in param.get("regexes", []))


def test_every_template_option_is_a_parameter() -> None:
    options, params = _options(), _parameters()
    # The launcher reads all of `linstream embed`'s options (the LinstreamOptions table).
    assert {f.dest for f in EMBED_FLAGS} <= set(options)
    assert set(NOT_PARAMETERS) <= set(options), "a named exception is no launcher option"
    assert not set(NOT_PARAMETERS) & set(params), "a named exception is declared after all"
    missing = sorted(set(options) - set(params) - set(NOT_PARAMETERS))
    assert not missing, f"metadata.json lacks the launcher options {missing}"


@pytest.mark.parametrize("name", sorted(set(_options()) - set(NOT_PARAMETERS)))
def test_a_parameter_accepts_what_its_option_accepts_and_no_more(name: str) -> None:
    action, param = _options()[name], _parameters()[name]
    assert param["label"] and param["helpText"] and param.get("regexes"), param
    if isinstance(action, argparse._StoreTrueAction) or action.nargs == "?":  # a boolean
        assert param.get("paramType") == "BOOLEAN", param
        assert _matches(param, "true") and _matches(param, "false")
        return
    if action.choices is not None:
        for choice in action.choices:
            assert _matches(param, str(choice)), (name, choice)
    if action.default is not None:
        assert _matches(param, str(action.default)), (name, action.default)
    for value in [*PROBES, *(action.choices or ())]:
        if not _matches(param, value):
            continue
        if action.choices is not None:
            assert value in action.choices, f"{name}: the regexes accept {value!r}, not a choice"
        if action.type is not None:
            try:
                action.type(value)
            except (argparse.ArgumentTypeError, ValueError) as ex:
                pytest.fail(f"{name}: the regexes accept {value!r}, which the option refuses: {ex}")
