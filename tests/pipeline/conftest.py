"""Pipeline test fixtures; helpers live in _beam_helpers.py (imported by name)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def model() -> Any:
    from linstream.ops import load_model

    return load_model("builtin:default")


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: Any) -> str:
    from helpers.models import write_tiny_model

    return write_tiny_model(str(tmp_path_factory.mktemp("model") / "tiny.safetensors"))
