"""Stopping rules of the Shapley stage: which candidates form the top, and which tests of its
separation from the rest still fail. A rule is a small object the stage is given
(`ShapleyRules.stop`), so a benchmark compares rules by passing them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from ._sign_test import signs_agree
from ._t_interval import apart

# A failing test, over indices of the candidates: ("zero", i, i) a top step whose phi
# interval reaches 0; ("signs", i, j) a pair of the top's i and a rival j whose sign test has
# not passed; ("apart", i, j) one whose sign test passed and paired t interval has not.
Failing = tuple[Literal["zero", "signs", "apart"], int, int]


@dataclass(frozen=True)
class Look:
    """What a rule sees at one look besides the per-seed phi: the level, the seeds the job's
    caps are projected to buy (None without a cap), and a candidate's phi interval's lower
    end from its column of per-seed values."""

    alpha: float
    horizon: float | None
    phi_low: Callable[[np.ndarray], float]


@dataclass(frozen=True)
class Judgement:
    """A rule's reading of the seeds: the leader (by mean phi), the top (the leader and every
    candidate not told apart from it), each pair's level, and the tests that fail. The top
    is separated when none fails."""

    lead: int
    top: list[int]
    pair_alpha: float
    failing: list[Failing]


class StopRule(Protocol):
    """Reads one look at the seeds (`phi`: one row a complete seed, one column a candidate)."""

    def judge(self, phi: np.ndarray, look: Look) -> Judgement: ...


def split(phi: np.ndarray, alpha: float) -> tuple[int, list[int], list[int], float]:
    """The leader by mean phi, the top (it and every candidate the paired t interval cannot
    tell from it), the rest (as column indices), and the level of each pair's test: alpha /
    (m - 1), Bonferroni over the leader's m - 1 rivals."""
    m = phi.shape[1]
    lead = int(np.argmax(phi.mean(axis=0)))
    pair_alpha = alpha / max(1, m - 1)
    top = [j for j in range(m) if j == lead or not apart(phi[:, lead] - phi[:, j], pair_alpha)]
    return lead, top, [j for j in range(m) if j not in top], pair_alpha


class SignAndT:
    """The shipped rule. The top is the leader and every candidate the paired t interval
    cannot tell from it (`split`); it is separated when each of its steps' phi interval lies
    above 0 and each pair of a top step and a rival passes both the sign test (`signs_agree`,
    valid at every look) and the paired t interval (`apart`, at a fixed level), each pair at
    alpha over the rivals."""

    def judge(self, phi: np.ndarray, look: Look) -> Judgement:
        lead, top, rest, pair_alpha = split(phi, look.alpha)
        failing: list[Failing] = [("zero", j, j) for j in top if look.phi_low(phi[:, j]) <= 0]
        for i in top:
            for j in rest:
                diff = phi[:, i] - phi[:, j]
                if not signs_agree(diff, pair_alpha):
                    failing.append(("signs", i, j))
                elif not apart(diff, pair_alpha):
                    failing.append(("apart", i, j))
        return Judgement(lead, top, pair_alpha, failing)
