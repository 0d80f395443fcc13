"""The engine tests run on one pytest-xdist worker (`make test` runs `-n 2 --dist loadgroup`):
one Flink job server and one Kafka broker for the session, not one per worker. The conftests of
tests/engines and tests/cloud mark their tests with an xdist group; xdist puts the group's name in
the test's id, and schedules the group on one worker. A pytest that keeps its ids where xdist
cannot rename them (9.2 with xdist 3.8) loses the groups without a word: this test says so."""

from __future__ import annotations

import pytest


def _under_loadgroup(request: pytest.FixtureRequest) -> bool:
    return bool(getattr(request.config.option, "loadgroup", False))


def test_the_engine_tests_are_one_xdist_group(request):
    if not _under_loadgroup(request):
        pytest.skip("only under `pytest -n N --dist loadgroup`, as `make test` runs the suite")
    assert request.node.nodeid.endswith("@engines"), (
        f"{request.node.nodeid}: pytest-xdist did not apply the engines group "
        f"(pytest {pytest.__version__}); see constraints.txt"
    )
