"""Exact Shapley values of a game given on every subset of its players."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

P = TypeVar("P", bound=Hashable)


def exact_shapley(f: Mapping[frozenset[P], float], players: Sequence[P]) -> dict[P, float]:
    """Shapley values of the game `f` (a value for every subset of `players`), exactly."""
    n = len(players)
    weight = [math.factorial(t) * math.factorial(n - t - 1) / math.factorial(n) for t in range(n)]
    phi: dict[P, float] = {}
    for i, player in enumerate(players):
        others = [p for j, p in enumerate(players) if j != i]
        total = 0.0
        for mask in range(1 << (n - 1)):
            t = frozenset(p for b, p in enumerate(others) if mask >> b & 1)
            total += weight[len(t)] * (f[t | {player}] - f[t])
        phi[player] = total
    return phi
