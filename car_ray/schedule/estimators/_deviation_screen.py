"""The deviation screen: which steps ever draw something other than their recorded action."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._group_game import GroupGame


@dataclass
class DeviationScreen:
    """Which steps ever draw something other than their recorded action (held tail).

    Each fork re-draws `block()`: every step not yet cleared and not yet seen to deviate. The
    fork's first deviation d (the first step where it left the tape) marks d as a choice-maker;
    every re-drawn step before d drew its recorded action once more (one clean observation).
    A step is cleared after `clean_needed` clean observations: a step that leaves the tape with
    probability q survives that with probability (1 - q)^clean_needed."""

    steps: list[int]
    clean_needed: int
    clean: dict[int, int] = field(default_factory=dict)
    hits: dict[int, int] = field(default_factory=dict)
    forks: int = 0
    # Forks that left the tape first at a step they did not re-draw: nothing the screen
    # chose explains them (nondeterminism outside the seams); after a few it gives up.
    strays: int = 0
    # Draws of other stages' forks that probed steps (`probed`), by (fork seed, step): a
    # fork seed fixes a step's fresh draw, so a draw seen twice is one observation.
    probes: set[tuple[int, int]] = field(default_factory=set)
    probe_forks: int = 0
    # Steps cleared on the outcome (`GroupGame`): each with the seeds in which re-drawing
    # its group changed nothing, in all its rounds, counted as its clean draws. They are
    # held from then on (re-drawn only as the quiet group of later rounds): never screened
    # or probed again, and not candidates even where they left the tape.
    settled: dict[int, int] = field(default_factory=dict)
    grouped: bool = False  # the group game has run (it runs once a job)
    # Rounds of the group game in which the steps earlier rounds settled changed the outcome.
    quiet_moved: int = 0
    # The group game's rounds that settled steps, by number: a verdict's clearance may ask
    # one to go on for more of their draws (`GroupGame.extended`).
    rounds: dict[int, GroupGame] = field(default_factory=dict)
    # The outcome check (`outcome`): screen forks that re-drew every step at once and kept
    # the recorded outcome, and whether any screen fork changed it.
    whole: int = 0
    moved: bool = False

    def block(self) -> list[int]:
        return [
            k
            for k in self.steps
            if k not in self.hits
            and k not in self.settled
            and self.clean.get(k, 0) < self.clean_needed
        ]

    def settle(
        self, steps: Sequence[int], seeds: int, carry: Mapping[int, int] | None = None
    ) -> None:
        """Steps whose group's re-draws changed the outcome in none of `seeds` seeds, each
        besides the seeds `carry` says it brought from earlier rounds of the group game: each
        counts them all as its clean draws, in place of any it had (its group's blame is at
        most how often a re-draw of the group changes the outcome, as a step's is at most how
        often it leaves the tape; draws before a step left the tape are not "none in n")."""
        carry = carry or {}
        for k in steps:
            self.settled[k] = self.clean[k] = carry.get(k, 0) + seeds

    def unsettle(self, steps: Sequence[int]) -> None:
        """Steps whose group changed the outcome in a seed of its round that went on
        (`GroupGame.broken`): not clear after all, they are candidates from then on."""
        for k in steps:
            self.settled.pop(k, None)
            self.clean.pop(k, None)
            self.hits[k] = max(1, self.hits.get(k, 0))

    def round_of(self, k: int) -> int | None:
        """The last round that settled step k (None if none did): its seeds are the ones
        that go on adding to k's clean draws."""
        for number, game in sorted(self.rounds.items(), reverse=True):
            if any(k in game.groups[g] for g in game.settled()):
                return number
        return None

    def done(self) -> bool:
        return not self.block() or self.strays >= 3

    def observe(self, block: Sequence[int], first_deviation: int | None) -> None:
        self.forks += 1
        for k in block:
            if first_deviation is not None and k >= first_deviation:
                break
            self.clean[k] = self.clean.get(k, 0) + 1
        if first_deviation is not None and first_deviation in block:
            self.hits[first_deviation] = self.hits.get(first_deviation, 0) + 1
        elif first_deviation is not None and first_deviation < min(block, default=0):
            self.strays += 1

    def outcome(self, block: Sequence[int], flipped: bool) -> None:
        """A scored screen fork's outcome. One that re-drew every step and kept the recorded
        outcome is a draw of the whole tape's re-draw (`whole`): as all steps' blame sums to
        how often that changes the outcome (the Shapley value is efficient), n of them and
        none changed bound the sum as n clean draws bound a step (`bound_after`)."""
        if flipped:
            self.moved = True
        elif not self.moved and set(block) == set(self.steps):
            self.whole += 1

    def probed(self, seed: int, steps: Sequence[int], first_deviation: int | None) -> None:
        """Another stage's fork (fork seed `seed`) probed `steps` (`replay.Probe`): each probed
        step before its first deviation drew its recorded action at its recorded request, as
        a screen fork's re-drawn steps do, unless a fork of the same seed showed that draw
        already; a probed step that is its first deviation is found. A first deviation at a
        step it did not probe is that fork's own business (it re-drew that step)."""
        self.probe_forks += 1
        for k in sorted(steps):
            if first_deviation is not None and k >= first_deviation:
                break
            if (seed, k) not in self.probes:
                self.probes.add((seed, k))
                self.clean[k] = self.clean.get(k, 0) + 1
        if first_deviation is not None and first_deviation in steps:
            self.hits[first_deviation] = self.hits.get(first_deviation, 0) + 1

    @property
    def candidates(self) -> list[int]:
        return sorted(k for k in self.hits if k not in self.settled)

    def deviation_bound(self, k: int, alpha: float) -> float:
        """An upper bound on how often step k leaves the tape, from its clean observations
        (0 of n: the exact binomial bound 1 - alpha^(1/n))."""
        return self.bound_after(self.clean.get(k, 0), alpha)

    @staticmethod
    def bound_after(n: int, alpha: float) -> float:
        """The deviation bound after n clean observations and none that left the tape."""
        return 1.0 if n == 0 else float(1.0 - alpha ** (1.0 / n))

    @staticmethod
    def percent_after(n: int, alpha: float) -> int:
        """`bound_after` in whole percent, rounded up: a bound is a most, and "14%" must not
        read below it."""
        return math.ceil(round(DeviationScreen.bound_after(n, alpha) * 100, 9))

    @staticmethod
    def clean_for(bound: float, alpha: float) -> int:
        """The fewest clean observations whose `deviation_bound` is below `bound`."""
        if bound >= 1.0:
            return 1
        if bound <= 0.0:
            raise ValueError(f"no number of clean observations bounds a deviation by {bound}")
        # A bound below the float resolution (a top's phi_lo of 3e-17) has log(1 - b) == 0:
        # log1p keeps it, and the count is as large as it must be (callers cap it).
        step = math.log(1.0 - bound) or math.log1p(-bound)
        return math.floor(math.log(alpha) / step) + 1
