"""How often a step re-drawn at its recorded request makes its recorded decision."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from ...replay import ForkSpec, Probe, Resample


@dataclass
class DecisionShares:
    """How often each step, drawn afresh at its recorded request, made its recorded decision:
    from every scored fork that re-drew or probed it while the run was still on the tape (at
    or before the fork's first deviation), once per fork seed (a fork seed fixes a step's
    draw there, so the forks of one Shapley seed show it once). `coupling` turns the steps
    seen to choose into what a held fork needs to keep their decisions as a maximal coupling
    would where the provider cannot replay a draw (`replay.Run._coupled`)."""

    most: int
    span: float
    lower: float
    kept: Counter[int] = field(default_factory=Counter)
    left: Counter[int] = field(default_factory=Counter)
    seen: set[tuple[int, int]] = field(default_factory=set)

    def observe(self, spec: ForkSpec, first_deviation: int | None) -> None:
        drawn = sorted(
            k for k, iv in spec.interventions.items() if isinstance(iv, Resample | Probe)
        )
        for k in drawn:
            if first_deviation is not None and k > first_deviation:
                break
            if (spec.seed, k) in self.seen:
                continue
            self.seen.add((spec.seed, k))
            if k == first_deviation:
                self.left[k] += 1
            else:
                self.kept[k] += 1

    def draws(self, k: int) -> int:
        """Step k's draws at its recorded request seen so far."""
        return self.kept[k] + self.left[k]

    def share(self, k: int) -> float:
        """The recorded decision's share of step k's draws at its recorded request, with one
        draw each way added (Laplace's rule: a step found at its first draw is not taken
        never to make its recorded decision)."""
        return (self.kept[k] + 1) / (self.kept[k] + self.left[k] + 2)

    def low_share(self, k: int) -> float:
        """The recorded decision's share of step k's draws, read low: the `lower` quantile of
        its Jeffreys posterior Beta(kept + 1/2, left + 1/2), at least 1 / `most`. The
        coupling keeps d with chance min(1, p'(d) / share): a share read too high makes a
        step whose changed request left its share alone draw afresh, and hands blame to
        every harmless step before it (the precursor tie the held game removes); read low,
        the error falls on keeping d where a change lowered its share a little."""
        from scipy.stats import beta

        low = float(beta.ppf(self.lower, self.kept[k] + 0.5, self.left[k] + 0.5))
        return max(low, 1.0 / self.most)

    def coupling(self) -> dict[int, tuple[float, int]]:
        """Every step seen to choose otherwise at its recorded request whose recorded
        decision `most` draws would expect to see at least once (`share`): its share read
        low (`low_share`) and the draws a changed request gets, `span` / that share of them
        (about `span` expected draws of the recorded decision where the change left its
        share alone), at most `most`. A step whose recorded decision is rarer (its words,
        where a job holds whole actions of a model that never repeats them) draws live:
        its draws could not tell its share."""
        out: dict[int, tuple[float, int]] = {}
        for k in sorted(self.left):
            if self.share(k) * self.most >= 1:
                low = self.low_share(k)
                out[k] = (round(low, 6), min(self.most, math.ceil(self.span / low)))
        return out
