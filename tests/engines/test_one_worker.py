"""The engine tests run on one pytest-xdist worker (`make test` runs `-n 2 --dist loadgroup`):
one Flink job server and one Kafka broker for the session, not one per worker. The conftests of
tests/engines and tests/cloud mark their tests with an xdist group; xdist puts the group's name in
the test's id, and schedules the group on one worker. A pytest that keeps its ids where xdist
cannot rename them (9.2 with xdist 3.8) loses the groups without a word: this test says so."""

from __future__ import annotations

from helpers.xdist_groups import assert_in_xdist_group


def test_the_engine_tests_are_one_xdist_group(request):
    assert_in_xdist_group(request, "engines")
