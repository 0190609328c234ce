"""``benchmarks.service``'s runs treat the yardstick and the service alike."""

from __future__ import annotations

from benchmarks.service import alternated


def test_each_round_reverses_which_of_the_yardstick_and_the_service_runs_first():
    """The yardstick ran first in every round, the service always straight after it had stopped."""
    assert [alternated(["yardstick", "service"], repeat) for repeat in range(3)] == [
        ["yardstick", "service"],
        ["service", "yardstick"],
        ["yardstick", "service"],
    ]
    assert alternated(["service"], 1) == ["service"]
