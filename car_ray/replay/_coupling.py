"""How often a coupled step keeps its recorded decision, from a few draws of its changed
request (`Run._coupled`).

A maximal coupling of a step's recorded distribution p and its changed one p' keeps the
recorded decision d with probability g(p') = min(1, p'(d) / p(d)). car-ray knows p(d) (an
estimate, `DecisionShares`) and sees X of n draws of the changed request decide d, X ~
Binomial(n, p'(d)); it keeps d with probability f(X). Whatever f, the chance it keeps d is
a polynomial in p'(d) of degree n, and g has a kink at p(d): no f gives g exactly (a
Bernoulli factory for a function that reaches 1 does not exist). `keep_chances` is the f
whose chance is nearest g at its worst over every p'(d) in [0, 1] (minimax, a small linear
programme), with f(0) = 0 (a changed request that never decided d keeps it never) and f
non-decreasing. The plug-in rule f(x) = min(1, x / (n p)) is one such f, and not the best:
at p(d) = 0.2 with 8 draws its chance is up to 0.29 from g, the minimax one's up to 0.17.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

# Points of p'(d) in [0, 1] the worst case is taken over (the chance is a polynomial of
# degree at most 8: between points it moves by far less than the bias it bounds).
_GRID = 401


def _chances(draws: int) -> tuple[np.ndarray, np.ndarray]:
    """The grid of p'(d), and the chance of each count of `draws` draws deciding d at each
    point of it (grid x (draws + 1))."""
    from scipy.stats import binom

    q = np.linspace(0.0, 1.0, _GRID)
    return q, binom.pmf(np.arange(draws + 1)[None, :], draws, q[:, None])


@lru_cache(maxsize=256)
def keep_chances(draws: int, share: float) -> tuple[float, ...]:
    """f(0), ..., f(`draws`): the chance to keep d when x of `draws` draws decided it, for a
    recorded share p(d) = `share` in (0, 1] (see the module)."""
    from scipy.optimize import linprog

    if draws < 1 or not 0.0 < share <= 1.0:
        raise ValueError(f"keep_chances: draws >= 1 and a share in (0, 1], not {draws}, {share}")
    q, chance = _chances(draws)
    target = np.minimum(1.0, q / share)
    width = draws + 2  # f(0..n) and the worst bias t
    ones = np.ones((_GRID, 1))
    # |chance @ f - target| <= t at every point; f(x) - f(x + 1) <= 0.
    rises = np.zeros((draws, width))
    for x in range(draws):
        rises[x, x], rises[x, x + 1] = 1.0, -1.0
    a_ub = np.vstack([np.hstack([chance, -ones]), np.hstack([-chance, -ones]), rises])
    b_ub = np.concatenate([target, -target, np.zeros(draws)])
    cost = np.zeros(width)
    cost[-1] = 1.0
    bounds = [(0.0, 0.0)] + [(0.0, 1.0)] * draws + [(0.0, None)]
    solved = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if not solved.success:  # pragma: no cover - a feasible, bounded programme always solves
        raise RuntimeError(f"keep_chances({draws}, {share}): {solved.message}")
    return tuple(float(min(1.0, max(0.0, v))) for v in solved.x[: draws + 1])


def worst_bias(draws: int, share: float) -> float:
    """How far the chance `keep_chances` keeps d can be from min(1, p'(d) / `share`), at its
    worst over p'(d) in [0, 1] (on the module's grid)."""
    q, chance = _chances(draws)
    kept = chance @ np.array(keep_chances(draws, share))
    return float(np.abs(kept - np.minimum(1.0, q / share)).max())
