"""Intervals and exact Shapley values shared by the held mechanism and the uniform scheme."""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

from scipy.stats import norm

P = TypeVar("P", bound=Hashable)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1) (1 - confidence); got {alpha!r}")


@functools.lru_cache(maxsize=64)
def _z(alpha: float) -> float:
    return float(norm.ppf(1.0 - alpha / 2.0))


def wilson(successes: float, n: int, alpha: float) -> tuple[float, float]:
    """The Wilson score interval for a Bernoulli mean at a fixed n (for reporting, not for
    adaptive stopping); (0, 1) when n == 0."""
    _check_alpha(alpha)
    if not 0 <= successes <= n:
        raise ValueError(f"wilson needs 0 <= successes <= n; got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    z = _z(alpha)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


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
