"""The t interval of a mean of independent bounded draws, with Wilson's margin as its floor: a
candidate's phi over the seeds, and the paired test that tells a top step from a rival (at a
fixed level at each look: the sign test beside it is the one valid at every look)."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm, t

from .._interval import Interval


def mean_interval(
    values: np.ndarray, alpha: float, *, low: float, high: float, scale: float = 1.0
) -> Interval:
    """The mean of independent draws bounded in [low, high] with a t interval, never narrower
    than the Wilson margin scale * z^2 / (n + z^2), so that n identical draws never give a
    zero-width interval: for 0/1 draws (scale 1) that is the distance Wilson's interval keeps
    from an observed 0 or 1. (A floor, not a margin added in quadrature: the t interval is
    honest once the draws vary, and the added margin cost about a third more seeds.)"""
    x = values[~np.isnan(values)]
    n = int(x.size)
    if n == 0:
        return Interval(None, None, None, 0)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, low, high, n)
    z = float(norm.ppf(1 - alpha / 2))
    spread = float(t.ppf(1 - alpha / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    floor = scale * z * z / (n + z * z)
    half = max(spread, floor)
    return Interval(mean, max(low, mean - half), min(high, mean + half), n)


def mean_lower(x: np.ndarray, levels: np.ndarray, *, low: float) -> np.ndarray:
    """`mean_interval`'s lower end as a one-sided bound at each of `levels`: the t bound,
    never closer to the mean than the Wilson margin where it lies below it (level < 1/2)."""
    n = int(x.size)
    if n < 2:
        return np.full_like(levels, low, dtype=np.float64)
    mean = float(x.mean())
    spread = np.asarray(t.isf(levels, n - 1), dtype=np.float64) * float(x.std(ddof=1))
    spread /= math.sqrt(n)
    z = np.asarray(norm.isf(levels), dtype=np.float64)
    spread = np.where(levels < 0.5, np.maximum(spread, z * z / (n + z * z)), spread)
    return np.maximum(low, mean - spread)


def apart(diff: np.ndarray, alpha: float) -> bool:
    """Whether paired differences are shown above 0 (`mean_interval`'s lower end at alpha)."""
    d = mean_interval(diff, alpha, low=-2.0, high=2.0)
    return d.low is not None and d.low > 0


def seeds_needed(values: np.ndarray, alpha: float) -> float:
    """The seeds at which `mean_interval`'s lower end (at alpha, scale 1) would pass 0 if the
    mean and spread of `values` held: past both the spread (z sd / mean)^2 and the Wilson
    floor z^2 (1 / mean - 1). inf when the mean is not above 0."""
    mean = float(values.mean())
    if mean <= 0:
        return math.inf
    z = float(norm.isf(alpha / 2))
    sd = float(values.std(ddof=1)) if values.size > 1 else 0.0
    return max((z * sd / mean) ** 2, z * z * (1.0 / mean - 1.0))
