"""The object-store tests run on one pytest-xdist worker, with one S3 and one GCS server for the
session (see tests/engines/test_one_worker.py)."""

from __future__ import annotations

import pytest


def test_the_object_store_tests_are_one_xdist_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only under `pytest -n N --dist loadgroup`, as `make test` runs the suite")
    assert request.node.nodeid.endswith("@cloud"), (
        f"{request.node.nodeid}: pytest-xdist did not apply the cloud group "
        f"(pytest {pytest.__version__}); see constraints.txt"
    )
