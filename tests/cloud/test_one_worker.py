"""The object-store tests run on one pytest-xdist worker, with one S3 and one GCS server for the
session (see tests/engines/test_one_worker.py)."""

from __future__ import annotations

from helpers.xdist_groups import assert_in_xdist_group


def test_the_object_store_tests_are_one_xdist_group(request):
    assert_in_xdist_group(request, "cloud")
