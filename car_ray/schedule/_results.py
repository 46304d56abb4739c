"""What each stage hands back when it ends: a frozen, typed result. The job's table, notes and
answer are built from these (`_table`), never from a stage's state or a note's text."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .._notes import Note
from ._interval import Interval
from .estimators import DeviationScreen

# (phi, necessity, sufficiency) of a candidate, each with its interval.
Estimates = Mapping[int, tuple[Interval, Interval, Interval]]
# A verdict of the held mechanism: ("separated" | "precise", its top steps).
Verdict = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class ControlResult:
    """The negative control: whether the fork that changes nothing failed to reproduce the
    recorded outcome (every fork after it would measure the nondeterminism)."""

    failed: bool
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class FlipCounts:
    """Flips and scored forks per arm key of one stage (`arms` or `uniform`); `exact` holds
    the arms whose one fork is their exact value (a seed-honouring provider, no fresh draw)."""

    stage: str
    counts: Mapping[str, tuple[int, int]]
    exact: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ScreenResult:
    """What the deviation screen saw: the steps it screens, the steps found to leave the tape
    (`candidates`), each step's clean re-draws, its forks (and the Shapley forks that probed
    for it), forks that left the tape where nothing was re-drawn (`strays`), the clean draws
    it had asked for, and its verdict when it found nothing: ("separated", ()) once every
    step had the clean draws the job's target asks (`JobContext.clean_enough`; or it gave up
    on strays), or once its outcome check had as many forks of every step that kept the
    outcome (every step then settled on them)."""

    steps: tuple[int, ...]
    candidates: tuple[int, ...]
    clean: Mapping[int, int]
    forks: int
    probe_forks: int
    strays: int
    clean_needed: int
    verdict: Verdict | None = None
    # Steps cleared on the outcome by the group game, each with its group's seeds that
    # changed nothing (`DeviationScreen.settled`; those seeds are in `clean` too).
    settled: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    # The outcome check: screen forks that re-drew every step and kept the outcome, and
    # whether a screen fork changed it (`DeviationScreen.outcome`).
    whole: int = 0
    moved: bool = False

    def deviation_bound(self, k: int, alpha: float) -> float:
        """An upper bound on how often step k leaves the tape (`DeviationScreen.bound_after`
        its clean draws)."""
        return DeviationScreen.bound_after(self.clean.get(k, 0), alpha)


@dataclass(frozen=True)
class Unsettled:
    """Why a Shapley's top did not separate before its budget ended (`text`, as the note
    says it; `reasons`, the tests that fail), and, when the forks so far project it, about
    how many more would separate it (`forks`), the more the suggested cap allows (`more`:
    the projection and GO_ON_SLACK of it again) and the options that go on (`go_on`)."""

    text: str
    reasons: tuple[str, ...] = ()
    forks: int | None = None
    more: int | None = None
    go_on: str | None = None


@dataclass(frozen=True, eq=False)
class ShapleyResult:
    """The held Shapley that answers (the last one, or the one before it: `ShapleyRules.
    answering`): its candidates, complete seeds and per-seed phi (one row a seed), its
    estimates, its verdict (None: the budget ended first), why it did not separate and what
    would (`unsettled`), the steps not found that lack the clean draws its top needs
    (`lacking`, for a lead), its notes, and the screen as it stood when it ended."""

    candidates: tuple[int, ...]
    seeds: tuple[int, ...]
    per_seed_phi: np.ndarray
    estimates: Estimates
    verdict: Verdict | None
    screen: ScreenResult
    unsettled: Unsettled | None = None
    lacking: Mapping[int, float] | None = None
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class DrawsResult:
    """What the provider was found to do with a recorded draw's seed (`Answer.provider_draws`):
    `replays` (an identical request with it answered as recorded, a fresh seed did not),
    `fresh` (it answered otherwise) or `unknown` (every step tried answered the same to
    every seed); `reasks` the forks that asked."""

    draws: str
    reasks: int
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class GroupsResult:
    """What a round of the group game says: its note (its groups, seeds and forks, the steps
    it cleared and those left, as figures too). What it cleared is in the screen's result
    (`ScreenResult.settled`)."""

    notes: tuple[Note, ...] = ()


# What a stage may hand back (none, one, or a Shapley result with its screen's).
StageResult = ControlResult | FlipCounts | ScreenResult | ShapleyResult | DrawsResult | GroupsResult
