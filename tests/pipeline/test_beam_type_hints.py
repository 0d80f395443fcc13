"""Beam reads the annotations of linstream's DoFns and PTransforms as type hints (from 2.78 also
under `from __future__ import annotations`, which every module here uses): each one must give a
hint Beam takes, without an error (a DoFn's `process` annotated `-> None` is refused: its output
hint must be iterable) or a warning (an `expand` returning a tuple of PCollections)."""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from typing import Any

import apache_beam as beam
import linstream.pipeline
import pytest


def _beam_classes() -> list[type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(linstream.pipeline.__path__, "linstream.pipeline."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if (
                inspect.isclass(cls)
                and cls.__module__ == module.__name__
                and issubclass(cls, (beam.DoFn, beam.PTransform, beam.CombineFn))
            ):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


CLASSES = _beam_classes()


def test_the_pipeline_has_beam_classes_to_check() -> None:
    names = {cls.__name__ for cls in CLASSES}
    assert {"SequenceDoFn", "EmbedSequences", "DecodeStreamMessages", "_PublishFn"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_annotations_are_type_hints_beam_takes(cls: type, caplog: Any) -> None:
    # The hints come from the methods alone: an instance without its constructor's arguments.
    instance = object.__new__(cls)
    with caplog.at_level(logging.WARNING):
        hints = instance.default_type_hints()
    assert hints is not None
    assert not caplog.records, [r.getMessage() for r in caplog.records]
