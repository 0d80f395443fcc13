"""Pipeline test fixtures; helpers live in tests/helpers/ (pipelines.py, cli.py, crash.py)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def model() -> Any:
    from linstream.ops import load_model

    return load_model("builtin:default")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: Any) -> str:
    from helpers.models import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny.safetensors"))
