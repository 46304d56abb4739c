"""The sign test of a pair of steps, valid however often it is looked at."""

from __future__ import annotations

import math

import numpy as np
from scipy.special import betaln

from .._tuning import SIGN_PRIOR


def signs_agree(diff: np.ndarray, alpha: float) -> bool:
    """The sign test, valid however often it is looked at: that i comes out ahead of j on a
    seed more often than j ahead of i (p, the share of i's wins among the seeds where they
    differ, above 1/2). It passes when the seeds where i beat j outnumber the others and a
    test martingale of a fair coin on the seeds where they differ has reached 1 / alpha:
    the likelihood ratio of p against 1/2, mixed over p with the prior half Beta(a, 1),
    half Beta(1, a) (a = SIGN_PRIOR). By Ville's inequality it ever passes with probability
    at most alpha at p = 1/2, whatever the prior and in either direction (the data choose
    which step leads); a p below 1/2 only makes a wrong "i beats j" rarer.

    What it does not show is the mean: a tie in phi is a fair coin here only when the pair's
    per-seed differences are as likely above 0 as below it (on a permutation chain, whose
    differences lie in {-2, ..., 2}: when +2 is as likely as -2, always so in a game where
    re-drawing one step never undoes another's flip). A tie in mean with skewed differences
    is guarded by the t interval beside it (`apart`), a fixed-level test at each look."""
    return sign_passes(int((diff > 0).sum()), int((diff < 0).sum()), alpha)


def sign_passes(wins: int, losses: int, alpha: float) -> bool:
    """`signs_agree` on counts: i ahead of j in `wins` seeds, behind in `losses`."""
    if wins <= losses:
        return False
    a = SIGN_PRIOR
    ahead = betaln(wins + a, losses + 1.0) - betaln(a, 1.0)
    behind = betaln(wins + 1.0, losses + a) - betaln(1.0, a)
    evidence = float(np.logaddexp(ahead, behind)) - math.log(2.0)
    evidence += (wins + losses) * math.log(2.0)
    return bool(evidence >= -math.log(alpha))


def signs_after(wins: int, losses: int, n: int, alpha: float) -> float:
    """The seeds after n at which the sign test (`sign_passes`) would pass if wins and
    losses went on at their rates so far (rounded down); 0 if it passes now, inf if it
    never would that way (no more wins than losses) or not within a hundred times n."""
    if sign_passes(wins, losses, alpha):
        return 0.0
    if wins <= losses or n == 0:
        return math.inf
    for more in range(1, 100 * n + 1):
        grown = (n + more) / n
        if sign_passes(int(wins * grown), int(losses * grown), alpha):
            return float(more)
    return math.inf
