"""The group game: which groups of steps can change the outcome, tested on the outcome itself.

A step that changes its words (or a decision nothing downstream reads) at every re-draw leaves
the tape every time, so the deviation screen takes it for a choice and Shapley must measure
it. The group game asks the outcome instead. Its players are groups of steps (contiguous
blocks); in each seed a random order of the groups is walked as a chain of forks, the first
re-drawing the first group, the next the first two, and so on (held tail, one fork seed for
the chain). A group's marginal in the seed is the change of outcome its fork made over the
fork before (the recorded run before the first, which does not flip): Owen's value of the
group (the Shapley value of the game whose players are the groups) is the mean of those
marginals, and |value| is at most the chance a seed's marginal is not 0. So a group whose
marginals are 0 in n seeds has its value bounded as a step with n clean draws has
(`DeviationScreen.bound_after`), and an over-determined pair split over two groups is still
seen (the second of the two in the order clears the failure the first could not), as is an
AND (the first of the two does).

A round after the first re-draws the steps earlier rounds settled as one more group (`quiet`):
a seed in which its marginal is 0 is one more clean draw of each of them, added to the seeds
each brought (`carry`), as a step whose blame is b leaves its group's marginal 0 with chance
at most 1 - b in any round.

A round ends after SCREEN_CLEAN seeds, when a group that never changed the outcome has the
clean draws a "no step to blame" needs; as soon as every group has changed the outcome (none
could be cleared); once MIN_SEEDS seeds are in, when the groups that never changed it have
the clean draws, with those they brought, that would bound them below EARLY_SHARE of the
strongest group's value (its exact lower bound); or, in a round that may split (`splits`),
after SPLIT_AFTER seeds once it knows what to split (`_splits_now`): its clean groups are
settled on few seeds and gather more as the quiet group of the rounds after it. Only seeds
whose every earlier seed is complete count, so a run that resumes from its rows ends each
round where it ended before, whatever order the rows came in.

A round that ended goes on for its settled groups when a verdict's clearance asks for more of
their draws (`extended`, `counted`): more seeds of the same chains, counted in order after
the round's own. A settled group whose marginal is not 0 in one of them was not clear after
all (`broken`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .._interval import exact_lower
from .._tuning import EARLY_SHARE, MIN_SEEDS, SCREEN_CLEAN, SPLIT_AFTER
from ._deviation_screen import DeviationScreen


def split(steps: Sequence[int], ways: int) -> list[tuple[int, ...]]:
    """`steps` (in order) as at most `ways` contiguous groups of near-equal size."""
    steps = sorted(steps)
    ways = max(1, min(ways, len(steps)))
    size, extra = divmod(len(steps), ways)
    out, at = [], 0
    for i in range(ways):
        n = size + (1 if i < extra else 0)
        out.append(tuple(steps[at : at + n]))
        at += n
    return out


@dataclass
class GroupGame:
    """One round of the group game over `groups` (see the module): chains of forks, one seed
    each, until every group survives or is cleared (`decided`)."""

    groups: list[tuple[int, ...]]
    alpha: float
    salt: str = ""  # the attribution's seed and the round: which orders a job walks
    outcomes: dict[int, dict[frozenset[int], bool]] = field(default_factory=dict)
    failed: set[int] = field(default_factory=set)  # a fork of the seed has no outcome
    # Complete seeds in order up to where the round ended (None while it runs), and how far
    # the prefix has been looked at.
    decided_at: int | None = None
    _looked: int = 0
    # Seeds the round has gone on for since it ended, for its settled groups (`counted`).
    extended: int = 0
    _settled: list[int] | None = None  # `settled`, once the round has ended
    rows: dict[int, int] = field(default_factory=dict)  # forks observed, by seed
    # Steps an earlier round settled, re-drawn here as one group (its index; None in a first
    # round), and the seeds each step of the round brings from earlier rounds: a seed in which
    # its group's marginal was 0, in whichever round, is one more clean draw of it.
    quiet: int | None = None
    carry: dict[int, int] = field(default_factory=dict)
    # Whether the round may end as soon as it knows which groups to split (`decided`).
    splits: bool = False
    ended_to_split: bool = False

    def order(self, seed: int) -> list[int]:
        """The groups (by index) in the order seed `seed` walks them."""
        order = list(range(len(self.groups)))
        random.Random(f"car-ray/groups/{self.salt}/{seed}").shuffle(order)
        return order

    def coalitions(self, seed: int) -> list[frozenset[int]]:
        """The steps each fork of the seed re-draws, in chain order."""
        out, steps = [], frozenset[int]()
        for g in self.order(seed):
            steps = steps | frozenset(self.groups[g])
            out.append(steps)
        return out

    def observe(self, seed: int, coalition: frozenset[int], flipped: bool | None) -> None:
        if coalition not in self.coalitions(seed):
            return  # a row of another round's game
        self.rows[seed] = self.rows.get(seed, 0) + 1
        if flipped is None:
            self.failed.add(seed)
        else:
            self.outcomes.setdefault(seed, {})[coalition] = bool(flipped)

    def known(self, seed: int, coalition: frozenset[int]) -> bool:
        return coalition in self.outcomes.get(seed, {})

    def complete(self, seed: int) -> bool:
        return seed not in self.failed and len(self.outcomes.get(seed, {})) == len(self.groups)

    def marginals(self, seed: int) -> np.ndarray:
        """Each group's change of outcome in a complete seed (by group index)."""
        flips = self.outcomes[seed]
        out = np.zeros(len(self.groups))
        before = 0.0
        for g, coalition in zip(self.order(seed), self.coalitions(seed), strict=True):
            now = float(flips[coalition])
            out[g] = now - before
            before = now
        return out

    def seeds(self) -> list[int]:
        """The complete seeds the round counts: in order, up to the first seed that is
        neither complete nor failed (a failed seed is left out), and no further than where
        the round ended."""
        out: list[int] = []
        seed = 0
        while self.decided_at is None or len(out) < self.decided_at:
            if self.complete(seed):
                out.append(seed)
            elif seed not in self.failed:
                break
            seed += 1
        return out

    def next_seed(self) -> int:
        """The first seed with a fork not yet known, failed seeds skipped."""
        seed = 0
        while seed in self.failed or self.complete(seed):
            seed += 1
        return seed

    def matrix(self, seeds: Sequence[int]) -> np.ndarray:
        return np.array([self.marginals(s) for s in seeds]).reshape(len(seeds), len(self.groups))

    def decided(self) -> bool:
        """Whether the round has ended: SCREEN_CLEAN counted seeds; SPLIT_AFTER in a round
        that splits, once it knows what to (`_splits_now`); MIN_SEEDS in a last round once
        its group has changed the outcome and the quiet group has not
        (`_last_round_shown`); or MIN_SEEDS once every
        group has changed the outcome in one (none can be cleared), or once the groups that
        never did have the clean draws, with those their steps brought
        (`DeviationScreen.clean_for`), that bound their value
        below EARLY_SHARE of the strongest group's, at its exact lower bound (a group worth that
        much is clean so long with chance below alpha; the top a verdict will clear them
        against is in a group that changed the outcome, and a top weaker than that makes the
        round go on later, `extended`). Looks at each new length of the counted seeds in
        turn, so where it ends does not depend on the order rows came in."""
        if self.decided_at is not None:
            return True
        seeds = self.seeds()
        for n in range(self._looked + 1, len(seeds) + 1):
            self._looked = n
            m = self.matrix(seeds[:n])
            moved = np.any(m != 0, axis=0)
            ends = n >= SCREEN_CLEAN
            if not ends and self.splits and n >= SPLIT_AFTER and self._splits_now(moved):
                ends = self.ended_to_split = True
            if not ends and n >= MIN_SEEDS and self._last_round_shown(moved):
                ends = True
            if n >= MIN_SEEDS and moved.any():
                strongest = np.abs(m.sum(axis=0)).max()
                lower = float(exact_lower(strongest, n, np.array([self.alpha]))[0])
                ends = ends or bool(moved.all())
                # A share: the top a verdict clears them against may share its group's
                # value (an AND's halves in one group, or in two).
                part = lower * EARLY_SHARE
                if part > 0:
                    need = DeviationScreen.clean_for(part, self.alpha)
                    ends = ends or all(
                        n + self.carried(g) >= need for g in range(len(self.groups)) if not moved[g]
                    )
            if ends:
                self.decided_at = n
                return True
        return False

    def _splits_now(self, moved: np.ndarray) -> bool:
        """Whether the seeds so far tell the next round what to split: the quiet group
        changed the outcome (its steps were not clear: split with what is left), or a group
        of more than one step did and another did not."""
        if self.quiet is not None and moved[self.quiet]:
            return True
        mine = [g for g in range(len(self.groups)) if g != self.quiet]
        return any(moved[g] and len(self.groups[g]) > 1 for g in mine) and not all(
            moved[g] for g in mine
        )

    def _last_round_shown(self, moved: np.ndarray) -> bool:
        """Whether a last round (the steps left as one group, beside the quiet group) has
        shown what it is for: its group changed the outcome and the quiet group did not.
        How many more clean draws the quiet steps need is the verdict's to ask, against the
        top it names (`extended`): a bound guessed from the group's value would ask for more
        than a top worth the whole group needs, or less than an AND's half does."""
        if self.quiet is None or len(self.groups) != 2:
            return False
        return not moved[self.quiet] and bool(moved.any())

    def carried(self, g: int) -> int:
        """The fewest clean seeds a step of group g brings from earlier rounds."""
        return min(self.carry.get(k, 0) for k in self.groups[g])

    def active(self) -> list[int]:
        """Groups (by index) that changed the outcome in a counted seed."""
        m = self.matrix(self.seeds())
        return [g for g in range(len(self.groups)) if m.size and bool(np.any(m[:, g] != 0))]

    def settled(self) -> list[int]:
        """Groups (by index) that changed the outcome in none of the round's seeds, once it
        has ended (its seeds then no longer change: worked out once)."""
        if self.decided_at is None:
            return []
        if self._settled is None:
            active = set(self.active())
            self._settled = [g for g in range(len(self.groups)) if g not in active]
        return self._settled

    def forks(self) -> tuple[int, int]:
        """The forks observed of the round's own seeds (all of them while it runs) and of
        the seeds after its last counted one: its going on, and forks in flight when it
        ended (a job that resumes cannot tell the two apart, so both count as going on)."""
        if self.decided_at is None:
            return sum(self.rows.values()), 0
        last = max(self.seeds(), default=-1)
        own = sum(n for seed, n in self.rows.items() if seed <= last)
        return own, sum(self.rows.values()) - own

    def slots(self) -> list[int]:
        """The seeds the round counts once it has gone on `extended` seeds: the first
        `decided_at` + `extended` seeds no fork of which failed."""
        assert self.decided_at is not None, "a round goes on only once it has ended"
        out: list[int] = []
        seed = 0
        while len(out) < self.decided_at + self.extended:
            if seed not in self.failed:
                out.append(seed)
            seed += 1
        return out

    def counted(self) -> list[int]:
        """The complete seeds of `slots` in order, up to the first that is not complete:
        the seeds each settled group's draws are counted from."""
        out: list[int] = []
        for seed in self.slots():
            if not self.complete(seed):
                break
            out.append(seed)
        return out

    def waiting(self) -> list[int]:
        """The seeds of `slots` not yet complete: those the round's going on still needs."""
        return [s for s in self.slots() if not self.complete(s)]

    def broken(self) -> list[int]:
        """Settled groups whose marginal is not 0 in a counted seed."""
        seeds = self.counted()
        if not seeds:
            return []
        m = self.matrix(seeds)
        return [g for g in self.settled() if bool(np.any(m[:, g] != 0))]
