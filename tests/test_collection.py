"""The suite itself: every test it collects runs, in one process or in `make test`'s two."""

from __future__ import annotations

from collections import Counter

import pytest


def test_every_collected_test_has_a_node_id_of_its_own(request: pytest.FixtureRequest):
    """pytest-xdist hands tests to its processes by node id, so of tests sharing one only the first runs,
    reported once, and the rest are dropped without a word (pytest 9.2 gave schemathesis's 17 per-operation
    tests one id: 1,614 of 1,630 tests ran)."""
    counts = Counter(item.nodeid for item in request.session.items)
    shared = {nodeid: count for nodeid, count in counts.items() if count > 1}
    assert not shared, (
        f"node ids shared by several tests (only one of each would run under pytest-xdist): {shared}; "
        "pyproject.toml's dev extra bounds pytest for this"
    )
