"""Statistics of the attribution runner, checked against exact ground truth with fixed seeds.

Every tolerance below is stated next to its assertion; none is a number copied from a run.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import TypeVar

import pytest
from scipy.stats import binomtest

from car_ray.schedule import exact_shapley, wilson

P = TypeVar("P", bound=Hashable)


def test_wilson_matches_the_textbook_interval() -> None:
    for s, n in [(0, 10), (3, 10), (47, 100), (1000, 1000)]:
        expected = binomtest(s, n).proportion_ci(0.95, method="wilson")
        lo, hi = wilson(s, n, 0.05)
        assert lo == pytest.approx(expected.low, abs=1e-12)
        assert hi == pytest.approx(expected.high, abs=1e-12)
    assert wilson(0, 0, 0.05) == (0.0, 1.0)


def subsets(players: Sequence[P]) -> list[frozenset[P]]:
    return [
        frozenset(c) for r in range(len(players) + 1) for c in itertools.combinations(players, r)
    ]


def test_exact_shapley_on_games_with_known_values() -> None:
    players = ["a", "b", "c"]
    weights = {"a": 0.5, "b": -0.2, "c": 0.1}
    additive = {t: 0.3 + sum(weights[p] for p in t) for t in subsets(players)}
    assert exact_shapley(additive, players) == pytest.approx(weights)
    # Unanimity game on {a, b}: each of the two gets half, c nothing.
    unanimity = {t: float({"a", "b"} <= t) for t in subsets(players)}
    assert exact_shapley(unanimity, players) == pytest.approx({"a": 0.5, "b": 0.5, "c": 0.0})
