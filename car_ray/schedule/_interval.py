"""Intervals on a Bernoulli mean: the result type every estimator returns (`Interval`), Wilson's
interval at a fixed n, and the exact one-sided Clopper-Pearson bound."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, norm


@dataclass(frozen=True)
class Interval:
    value: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float:
        if self.low is None or self.high is None:
            return math.inf
        return (self.high - self.low) / 2


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


def proportion(values: np.ndarray, alpha: float, n: int) -> Interval:
    """The mean of 0/1 draws (NaN: not drawn) with Wilson's interval."""
    x = values[~np.isnan(values)]
    if x.size == 0:
        return Interval(None, None, None, 0)
    lo, hi = wilson(float(x.sum()), int(x.size), alpha)
    return Interval(float(x.mean()), lo, hi, int(x.size))


def exact_lower(successes: float, n: int, levels: np.ndarray) -> np.ndarray:
    """The Clopper-Pearson one-sided lower bound on a Bernoulli mean at each of `levels`
    (P(mean < bound) <= level, exactly: the bound is where P(as many successes or more) =
    level), for any level in (0, 1)."""
    if successes <= 0 or n == 0:
        return np.zeros_like(levels, dtype=np.float64)
    return np.asarray(beta.ppf(levels, successes, n - successes + 1), dtype=np.float64)
