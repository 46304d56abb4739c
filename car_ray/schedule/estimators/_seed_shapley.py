"""The seed-wise Shapley of the held game: Shapley blame over the steps the screen found, with
common random numbers, one seed at a time.

The game is v(S) = P(the outcome flips | the steps in S are re-drawn fresh, every other step
keeps its mechanism: its recorded answer while its request is unchanged, else an answer drawn
with the recorded draw's randomness). Two facts make it cheap:

- A step that draws its recorded action again leaves the run on the tape, so a fork that
  re-draws a whole block and never leaves the tape before step d shows that every step of the
  block before d drew its recorded action (`DeviationScreen`: one fork tests many steps).
- With one fork seed shared by every coalition, a seed fixes each step's fresh draw, so the
  game v_s of that seed is deterministic and its exact Shapley values phi_s are an unbiased
  draw of phi; seeds are independent, so the mean over seeds and a t interval are honest
  however many seeds the job stops at (`SeedShapley`).
- Within a seed, a step's fresh draw at its recorded request is one fixed action. A fork of
  the seed that re-draws step k and stays on the tape up to k shows that draw is the recorded
  one (k is clean in the seed). A coalition whose first steps are clean runs as the coalition
  without them (they meet their recorded requests and draw their recorded actions): a
  coalition of clean steps alone stays on the tape and does not flip, and {2, 4} with 2 clean
  runs as {4}; either is known with no fork run (`SeedShapley.known`). A seed's largest
  coalition goes first: it shows the most.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import combinations, permutations
from typing import Literal

import numpy as np

from .._interval import Interval, exact_lower, proportion
from .._tuning import BALANCED_UP_TO, EXACT_UP_TO, MIN_SEEDS
from ..rules import (
    Failing,
    Look,
    SignAndT,
    StopRule,
    clean_to_clear,
    mean_interval,
    mean_lower,
    seeds_needed,
    signs_after,
    split,
)
from ._exact import exact_shapley


@dataclass
class SeedShapley:
    """Shapley blame over `candidates` from per-seed games. With at most EXACT_UP_TO
    candidates every seed evaluates all 2^m - 1 non-empty coalitions (the empty one is the
    recorded run) and gives exact per-seed phi, necessity and sufficiency. Above, each seed
    walks one permutation chain (m forks): odd seeds walk the reverse of the even seed before
    (antithetic pairs), and up to BALANCED_UP_TO candidates the pairs cycle through every
    permutation, so phi is unbiased at every whole cycle and nearly so between. A chain gives
    the necessity of its first step and the sufficiency of its last."""

    candidates: list[int]
    alpha: float
    salt: str = ""  # the attribution's seed: which random permutations a job walks
    values: dict[int, dict[frozenset[int], float]] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)  # a fork of the seed has no outcome
    cut: set[int] = field(default_factory=set)  # a fork of the seed the budget refused
    # Per seed: the candidates whose fresh draw at the recorded request is the recorded action
    # (a fork of the seed re-drew or probed them and stayed on the tape past them).
    clean: dict[int, set[int]] = field(default_factory=dict)
    # Per seed: the candidates whose fresh draw at the recorded request left the tape (a
    # fork of the seed re-drew them with every step before them on the tape).
    dirty: dict[int, set[int]] = field(default_factory=dict)
    # Per seed: outcomes of coalitions outside its chain (an earlier Shapley's, over fewer
    # candidates): each tells the chain coalitions that run the same fork (`_acting`).
    extra: dict[int, dict[frozenset[int], float]] = field(default_factory=dict)
    _inferred: dict[int, set[frozenset[int]]] = field(default_factory=dict)
    # The stopping rule its verdict asks (`rules.StopRule`), and the seeds the job's caps are
    # projected to buy (set by the Shapley stage before each look; None without a cap).
    rule: StopRule = field(default_factory=SignAndT)
    horizon: float | None = None
    # Off a provider that couples draws, the candidates whose draw at their recorded request
    # a seed's later forks repeat (model steps, `standing`); only they are learned clean or
    # dirty. None: every candidate (the coupled provider repeats a seed's draw itself).
    learnable: frozenset[int] | None = None
    # Per seed: the action (JSON) a candidate drew where a fork of the seed left the tape
    # at it.
    drawn: dict[int, dict[int, str]] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return len(self.candidates) <= EXACT_UP_TO

    def coalitions(self, seed: int) -> list[frozenset[int]]:
        """The coalitions one seed evaluates, in order."""
        m = self.candidates
        if self.exact:
            return [frozenset(c) for size in range(1, len(m) + 1) for c in combinations(m, size)]
        if len(m) <= BALANCED_UP_TO:
            pairs = _antithetic_pairs(len(m))
            order = [m[i] for i in pairs[(seed // 2) % len(pairs)]]
        else:
            order = list(m)
            random.Random(f"car-ray/chain/{self.salt}/{seed // 2}").shuffle(order)
        if seed % 2:
            order.reverse()
        return [frozenset(order[: i + 1]) for i in range(len(order))]

    def first(self, seed: int) -> frozenset[int]:
        """The coalition a seed runs before the others: its largest (every candidate)."""
        return max(self.coalitions(seed), key=len)

    def observe(
        self,
        seed: int,
        coalition: frozenset[int],
        flipped: bool | None,
        first_deviation: int | Literal["unknown"] | None = "unknown",
        drawn: str | None = None,
    ) -> None:
        """A fork's outcome; `first_deviation` (the step where it left the tape, None if it
        never did) tells which of its steps drew their recorded action, and every coalition
        of the seed made of such steps alone is then known not to flip; `drawn` is the
        action the step it left the tape at drew there (`standing`). A coalition outside
        the seed's chain (a row of an earlier Shapley over fewer candidates) is kept for
        what it tells of the chain's."""
        if flipped is None:
            if coalition in self.coalitions(seed):
                self.failed.add(seed)
            return
        if coalition in self.coalitions(seed):
            self.values.setdefault(seed, {})[coalition] = float(flipped)
        else:
            self.extra.setdefault(seed, {})[coalition] = float(flipped)
        if first_deviation == "unknown":
            return
        first = first_deviation
        if first in coalition and self._learns(first):
            # Off a coupling provider a step is dirty in the seed with the action it drew (a
            # run that ended before it drew nothing there), and a step's first standing in
            # the seed is its only one (`standing`). An answer that could not be read
            # cannot be given again: the seed is left out, as a failed one is.
            if self.learnable is None:
                self.dirty.setdefault(seed, set()).add(first)
            elif drawn == "":
                self.failed.add(seed)
            elif drawn is not None and first not in self.clean.get(seed, ()):
                self.dirty.setdefault(seed, set()).add(first)
                self.drawn.setdefault(seed, {}).setdefault(first, drawn)
        self.learn_clean(seed, [k for k in coalition if first is None or k < first])

    def _learns(self, k: int) -> bool:
        """Whether a fork's draw of candidate k tells the seed's other forks (`learnable`)."""
        return self.learnable is None or k in self.learnable

    def learn_clean(self, seed: int, steps: Sequence[int]) -> None:
        """Candidates whose fresh draw in `seed` is their recorded action (a fork of the seed
        re-drew or probed them and stayed on the tape past them); the seed's coalitions that
        this shows to run as one already known are filled in."""
        dirty = self.dirty.get(seed, set()) if self.learnable is not None else set()
        self.clean.setdefault(seed, set()).update(
            k for k in steps if k in self.candidates and self._learns(k) and k not in dirty
        )
        values = self.values.setdefault(seed, {})
        # Coalitions alike once their leading clean steps are dropped run alike (`_acting`).
        known = {**self.extra.get(seed, {}), **values}
        by_acting = {self._acting(seed, c): v for c, v in known.items()}
        by_acting[frozenset()] = 0.0  # nothing acts: the recorded run, which never flips
        for other in self.coalitions(seed):
            acting = self._acting(seed, other)
            if other not in values and acting in by_acting:
                values[other] = by_acting[acting]
                self._inferred.setdefault(seed, set()).add(other)
        if not values:
            del self.values[seed]

    def _acting(self, seed: int, coalition: frozenset[int]) -> frozenset[int]:
        """The steps of a coalition that can change the seed's run: from its first step not
        known to draw its recorded action on. A clean step before it meets its recorded
        request (every step before it is held or drew its recorded action too), draws its
        recorded action and leaves the run on the tape, exactly as if it were held: the
        coalition without it runs the same fork."""
        clean = self.clean.get(seed, set())
        unclean = [k for k in coalition if k not in clean]
        if not unclean:
            return frozenset()
        first = min(unclean)
        return frozenset(k for k in coalition if k >= first)

    def standing(self, seed: int, k: int) -> Literal["clean", "fresh"] | str:
        """Off a coupling provider, how a fork of the seed draws candidate k where it meets it
        on the tape at its recorded request: "clean" (a fork of the seed drew its recorded
        decision there: the recorded answer), the action (JSON) a fork of the seed drew
        where it left the tape at k (forced), or "fresh" (no fork of the seed has drawn it
        there yet; its first draw then stands for the seed). With every step drawn there
        once a seed, its coalitions read one another (`_acting`) as on the coupled
        provider; a second draw there would make a step clean if either draw was."""
        if k in self.clean.get(seed, ()):
            return "clean"
        return self.drawn.get(seed, {}).get(k, "fresh")

    def known(self, seed: int, coalition: frozenset[int]) -> bool:
        return coalition in self.values.get(seed, {})

    def forks_per_seed(self) -> float:
        """Forks a complete seed has cost so far (its coalitions less those known without a
        fork); every coalition before any seed is complete."""
        seeds = self.complete_seeds()
        if not seeds:
            return float(len(self.coalitions(0)))
        inferred = sum(1 for s in seeds for c in self.values[s] if c in self._inferred.get(s, ()))
        return (sum(len(self.values[s]) for s in seeds) - inferred) / len(seeds)

    def complete_seeds(self) -> list[int]:
        """The seeds the estimates use: 0, 1, ... up to the first seed not complete (failed
        seeds left out). A seed that stays on the tape completes in one fork, others need
        more, so the complete seeds beyond an incomplete one are chosen by their outcome:
        counting them would pull phi toward 0 at every look."""
        out: list[int] = []
        last = max(self.values.keys() | self.failed, default=-1)
        for s in range(last + 1):
            if s in self.failed:
                continue
            got = self.values.get(s, {})
            if s in self.cut or len(got) < len(self.coalitions(s)):
                break
            out.append(s)
        return out

    def per_seed(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """phi_s, necessity_s and sufficiency_s, one row a complete seed, one column a
        candidate (NaN where a seed's chain does not measure it)."""
        seeds = self.complete_seeds()
        m = self.candidates
        phi = np.zeros((len(seeds), len(m)))
        nec = np.full((len(seeds), len(m)), np.nan)
        suf = np.full((len(seeds), len(m)), np.nan)
        everyone = frozenset(m)
        for r, s in enumerate(seeds):
            f = dict(self.values[s])
            f[frozenset()] = 0.0  # nothing re-drawn: the recorded run, which never flips
            if self.exact:
                shap = exact_shapley(f, m)
                phi[r] = [shap[k] for k in m]
                nec[r] = [f[frozenset({k})] for k in m]
                suf[r] = [1.0 - f[everyone - {k}] for k in m]
            else:
                chain = self.coalitions(s)
                before = frozenset[int]()
                for coalition in chain:
                    (k,) = coalition - before
                    phi[r, m.index(k)] = f[coalition] - f[before]
                    before = coalition
                (first,) = chain[0]
                (last,) = everyone - chain[-2]
                nec[r, m.index(first)] = f[chain[0]]
                suf[r, m.index(last)] = 1.0 - f[chain[-2]]
        return phi, nec, suf

    def estimates(self) -> dict[int, tuple[Interval, Interval, Interval]]:
        """Per candidate: phi, necessity and sufficiency, each with its interval."""
        phi, nec, suf = self.per_seed()
        n = phi.shape[0]
        out: dict[int, tuple[Interval, Interval, Interval]] = {}
        for j, k in enumerate(self.candidates):
            out[k] = (
                self._phi_interval(phi[:, j]),
                proportion(nec[:, j], self.alpha, n),
                proportion(suf[:, j], self.alpha, n),
            )
        return out

    def _phi_interval(self, values: np.ndarray) -> Interval:
        """A candidate's phi over the seeds. One candidate alone: each seed's phi is its one
        coalition's flip, a 0/1 draw, and Wilson's interval is the exact-enough one (the t
        interval is wider at a rate away from 1/2, and a separated top then needs more
        screening to clear the other steps). Otherwise the mean with a t interval."""
        if len(self.candidates) == 1:
            return proportion(values, self.alpha, int(values.size))
        return mean_interval(values, self.alpha, low=-1.0, high=1.0)

    def _phi_lower(self, values: np.ndarray, levels: np.ndarray) -> np.ndarray:
        """One-sided lower bounds on a candidate's phi, one at each of `levels` (any level in
        (0, 1): above 1/2 it lies above the mean): exact for one candidate (each seed a 0/1
        flip), else the t bound of `_phi_interval`'s lower end."""
        x = values[~np.isnan(values)]
        if len(self.candidates) == 1:
            return exact_lower(float(x.sum()), int(x.size), levels)
        return mean_lower(x, levels, low=-1.0)

    def clean_to_clear(
        self, k: int, alpha: float, more_seeds: int = 0, reach: float = 1.0
    ) -> float:
        """The clean draws a step the screen has not found needs before candidate k's phi is
        shown above that step's (`clean_to_clear`, the step's |phi| at most `reach` times
        its deviation rate), from the seeds so far (and `more_seeds` more at their mean, to
        ask what another seed would change); inf while k's phi is not shown above 0."""
        return clean_to_clear(self.phi_lower(k, more_seeds), alpha, reach)

    def phi_lower(self, k: int, more_seeds: int = 0) -> Callable[[np.ndarray], np.ndarray]:
        """Candidate k's one-sided lower bounds on phi at given levels (`_phi_lower`), from
        the seeds so far and `more_seeds` more at their mean: one function for many
        `clean_to_clear` calls (the seeds are read once)."""
        phi, _, _ = self.per_seed()
        values = phi[:, self.candidates.index(k)]
        if more_seeds and values.size:
            values = np.append(values, np.full(more_seeds, values.mean()))
        return lambda levels: self._phi_lower(values, levels)

    def reach(self, step: int, level: float) -> float:
        """An upper bound (one-sided at `level`) on the share of a step's Shapley weight in
        which it meets its recorded request, for a step the screen has not found. Its
        coalition S (the steps before it in a random order) leaves it at the recorded
        request only when no step of S before it left the tape; with d_s candidates before
        it that leave the tape in seed s, that is 1 / (1 + d_s) of the orders (it comes
        first among them), and its |phi| is at most its deviation rate times the mean of
        1 / (1 + d_s) (its own draw is independent of theirs). A candidate not known to
        leave the tape in a seed counts as staying on it (the bound only grows)."""
        seeds = self.complete_seeds()
        share = np.array(
            [1.0 / (1 + sum(1 for j in self.dirty.get(s, ()) if j < step)) for s in seeds]
        )
        # `mean_lower`'s t bound, mirrored to an upper one: never closer to the mean than
        # Wilson's margin (a handful of like seeds is not a share known exactly), 1 below two.
        return -float(mean_lower(-share, np.array([level]), low=-1.0)[0])

    def seeds_to_verdict(self) -> float:
        """How many more seeds `verdict`'s tests would need if the seeds to come were like
        those so far (each test's mean and spread held; the normal approximation of its t
        bound and Wilson floor, the sign test left out): 0 once they pass, inf while they
        cannot pass that way (a mean at or below 0) or before MIN_SEEDS seeds. The top is
        today's: a rival the pairs cannot yet tell from the leader is projected as one of
        the top. The Shapley stage keeps about half of what this leaves in flight."""
        n = len(self.complete_seeds())
        if not self.candidates:
            return 0.0
        if n < MIN_SEEDS:
            return math.inf
        phi, _, _ = self.per_seed()
        if len(self.candidates) == 1:
            # Wilson's lower end is above 0 from the first flip on.
            return 0.0 if phi[:, 0].sum() > 0 else math.inf
        _, top, rest, pair_alpha = split(phi, self.alpha)
        needed = [seeds_needed(phi[:, j], self.alpha) for j in top]
        needed += [seeds_needed(phi[:, i] - phi[:, j], pair_alpha) for i in top for j in rest]
        return max(0.0, max(needed) - n)

    def lacks(self) -> tuple[list[str], float, list[int]]:
        """Why `verdict` does not yet call the top separated, in words (a phrase a test that
        fails), how many more seeds would pass them all if the seeds to come were like those
        so far (`seeds_to_verdict`'s projection, and the sign test's: each pair's wins and
        losses growing at their rates so far; at least one while a test fails, since those
        projections use the normal where the tests use t; inf while a test cannot pass that
        way), and today's top. For a job whose budget ended first: what it would take to go
        on."""
        m = self.candidates
        n = len(self.complete_seeds())
        if not m:
            return [], 0.0, []
        if n < MIN_SEEDS:
            return [f"{n} complete seed(s), and a verdict needs {MIN_SEEDS}"], math.inf, []
        phi, _, _ = self.per_seed()
        lead, top, pair_alpha, failing = self._failing(phi)
        reasons: list[str] = []
        more = self.seeds_to_verdict()
        level = f"{(1 - pair_alpha) * 100:.4g}%"
        for test, i, j in failing:
            if test == "zero":
                own = f"blame is not shown above 0 at {1 - self.alpha:.0%}"
                reasons.append(
                    f"step {m[i]}'s {own}"
                    if i == lead
                    else f"step {m[i]} is not told apart from step {m[lead]} (the leader), and "
                    f"its {own}"
                )
            elif test == "signs":
                diff = phi[:, i] - phi[:, j]
                wins, losses = int((diff > 0).sum()), int((diff < 0).sum())
                more = max(more, signs_after(wins, losses, n, pair_alpha))
                reasons.append(
                    f"step {m[i]} came out ahead of step {m[j]} in {wins} seed(s) and behind "
                    f"in {losses}: not yet enough for the sign test at {level}, valid at every "
                    "look"
                )
            else:
                reasons.append(f"step {m[i]}'s lead over step {m[j]} is not shown")
        if reasons:
            more = max(more, 1.0)
        return reasons, more, [m[j] for j in top]

    def _failing(self, phi: np.ndarray) -> tuple[int, list[int], float, list[Failing]]:
        """The leader, the top, its pairs' level and the tests of separation that fail, as
        the stopping rule reads the seeds (`rules.StopRule`). The top is separated when none
        fails (`verdict`)."""
        look = Look(self.alpha, self.horizon, lambda col: self._phi_interval(col).low or 0.0)
        judged = self.rule.judge(phi, look)
        return judged.lead, judged.top, judged.pair_alpha, judged.failing

    def verdict(self, target_half_width: float) -> tuple[str, list[int]] | None:
        """('separated', top) when the top step(s) are apart from every other step,
        ('precise', top) when every interval is within the target, None while neither holds.

        The top is the leader by mean phi and every candidate the data cannot tell from it
        (the two halves of an AND, say). Separation is judged on paired differences: with
        one seed shared by every coalition, phi_s(leader) - phi_s(j) varies far less than
        either phi_s, so the pairs separate with fewer seeds than the two intervals would
        (a t interval per pair at alpha / (m - 1), Bonferroni over the m - 1 rivals). The
        steps the screen cleared have phi 0: the top must also lie above 0."""
        if not self.candidates:
            return "separated", []
        if len(self.complete_seeds()) < MIN_SEEDS:
            return None
        phi, _, _ = self.per_seed()
        m = self.candidates
        _, top, _, failing = self._failing(phi)
        if not failing:
            return "separated", [m[j] for j in top]
        own = [self._phi_interval(phi[:, j]) for j in range(len(m))]
        if all(e.half_width <= target_half_width for e in own):
            # Precise, but an answer only where the blame is shown above 0: a step of the
            # top whose interval reaches 0 may have no blame at all.
            return "precise", [m[j] for j in top if (own[j].low or 0.0) > 0]
        return None


def _antithetic_pairs(m: int) -> list[tuple[int, ...]]:
    """Every permutation of range(m) that comes before its reverse: with the reverses, all."""
    return [p for p in permutations(range(m)) if p <= p[::-1]]
