"""The check that a test ran in its pytest-xdist group (tests/engines and tests/cloud keep their
servers to one worker that way; see tests/engines/test_one_worker.py)."""

from __future__ import annotations

import pytest


def assert_in_xdist_group(request: pytest.FixtureRequest, group: str) -> None:
    """Fails when pytest-xdist did not put ``request``'s test in ``group``; skips outside
    `pytest -n N --dist loadgroup` (the only mode that applies groups)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("only under `pytest -n N --dist loadgroup`, as `make test` runs the suite")
    assert request.node.nodeid.endswith(f"@{group}"), (
        f"{request.node.nodeid}: pytest-xdist did not apply the {group} group "
        f"(pytest {pytest.__version__}); see constraints.txt"
    )
