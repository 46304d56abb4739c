"""The clearance bound: how many clean re-draws of a step the screen has not found show its
blame below a top step's, tested jointly with the top's seeds."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from .._tuning import CLEAR_GRID_RATIO


def product_threshold(alpha: float) -> float:
    """The c at which two independent p-values have a product below c with probability at
    most alpha: P(U1 * U2 <= c) = c (1 - ln c) for independent uniforms (less for p-values
    that are super-uniform)."""
    low, high = 0.0, alpha
    for _ in range(60):
        mid = (low + high) / 2
        if mid * (1 - math.log(mid)) <= alpha:
            low = mid
        else:
            high = mid
    return low


def clean_to_clear(
    lower: Callable[[np.ndarray], np.ndarray], alpha: float, reach: float = 1.0
) -> float:
    """How many clean draws (and no deviation) of a step the screen has not found show, at
    level `alpha`, that its phi is below a top candidate's; `lower(level)` is the top's
    one-sided lower bound at `level`. inf if the top is not shown above 0 at the threshold.

    A step not found leaves the tape at its recorded request with some probability q, and
    |phi| <= q. Its draws and the top's seeds are independent, so two p-values test q >=
    phi_top together: (1 - x)^L for its run L of clean draws, and the top's p(x), at most
    `level` for x at most lower(level). Their product is below c = `product_threshold(alpha)`
    with probability at most alpha whatever x; the step is shown below the top when (1 -
    x)^n * p(x) <= c for every x, with n <= L its clean draws so far. That holds however n
    came about (the screen draws as many as the top's seeds ask for), and takes about half
    the draws of a bound on q below the top's own lower bound at the same alpha (6 flips in
    30 seeds at 5%: 24 draws against 46). Over levels g_0 = c < g_1 < ... the product on
    [lower(g_i), lower(g_i+1)] is at most g_i+1 * (1 - lower(g_i))^n. A step whose |phi| is
    at most `reach` times its deviation rate (`SeedShapley.reach`) is below the top when
    that rate is below phi_top / reach: (1 - x / reach)^n for the first factor."""
    c, levels = _clear_levels(alpha)
    lows = lower(levels)
    if lows[0] <= 0.0:
        return math.inf
    bounds = lows / reach
    # Level i holds on [lower(g_i), lower(g_i+1)] with a p-value at most g_i+1.
    above = np.append(levels[1:], 1.0)
    keep = bounds < 1.0
    if not keep.any():
        return 1.0
    # above * (1 - bound)^n <= c
    need = np.ceil(np.log(c / above[keep]) / np.log1p(-bounds[keep]))
    return max(1.0, float(need.max()))


@functools.cache
def _clear_levels(alpha: float) -> tuple[float, np.ndarray]:
    """`clean_to_clear`'s threshold c for `alpha` and its levels: c, c * CLEAR_GRID_RATIO,
    ... up to 0.99."""
    c = product_threshold(alpha)
    levels = [c]
    while levels[-1] < 0.99:
        levels.append(min(0.99, levels[-1] * CLEAR_GRID_RATIO))
    grid = np.array(levels)
    grid.setflags(write=False)  # shared by every call
    return c, grid
