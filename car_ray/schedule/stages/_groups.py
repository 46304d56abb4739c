"""The group stage: once the screen has found many steps that leave the tape, ask the outcome
which groups of them matter (`GroupGame`), split those that do, and hand Shapley the few
steps left."""

from __future__ import annotations

import itertools
from types import MappingProxyType
from typing import Any

import numpy as np

from ..._notes import Note
from ...execute import Row
from ...replay import ForkSpec, Intervention, Resample
from .._context import JobContext, coalition_of
from .._results import GroupsResult, ShapleyResult, StageResult
from .._tuning import GROUP_WAYS, GROUPS_FROM, SEEDS_IN_FLIGHT
from ..estimators import DeviationScreen, GroupGame, split
from ._base import BaseStage, Fork, Next
from ._screening import screen_result

# Rounds whose quiet group changed the outcome after which no round ends to split (one more
# such round, and Shapley measures what is left): the rounds of a job are finite.
QUIET_MOVES = 2

# Fork seeds of the group game (of the attribution's 2^32): above the Shapley seeds' first
# 2^30, each round its own 2^24, so no fork of a round shares a seed with another stage's.
GROUP_SEEDS = 3 << 30
ROUND_SEEDS = 1 << 24


def grouped(ctx: JobContext, screen: DeviationScreen) -> bool:
    """Whether a job should ask the outcome about groups before Shapley: the group game has
    not run yet (it runs once), and the screen has found GROUPS_FROM steps or more, or an
    earlier run of the job played it (a job that resumes goes where it went)."""
    if screen.grouped:
        return False
    return len(screen.candidates) >= GROUPS_FROM or played(ctx)


def played(ctx: JobContext) -> bool:
    """Whether the job has rows of the group game (from this run or an earlier one)."""
    return any(st == "groups" for st, _ in ctx.rows.by_arm)


class HeldGroups(BaseStage):
    """One round of the group game over `steps` (every step the screen screens, on the first
    round), in GROUP_WAYS contiguous groups (one, if that many steps or fewer), and on later
    rounds the steps earlier rounds settled as one quiet group: chains of forks, in blocks
    of SEEDS_IN_FLIGHT seeds, until the round ends (`GroupGame.decided`). Groups that
    changed the outcome in no seed are settled (`DeviationScreen.settle`: held in Shapley,
    their seeds, with those they brought, counted as clean draws); a quiet group that did
    is measured again (`DeviationScreen.unsettle`). With nothing left, no step is to blame;
    with GROUP_WAYS steps or fewer left after a round that ended to split, a last round
    clears the quiet steps against them; with that few left otherwise, or none newly
    settled, Shapley measures them (`HeldShapley`, the settled steps' clearance behind its
    verdict); else the next round splits them again."""

    name = "groups"

    def __init__(
        self,
        ctx: JobContext,
        screen: DeviationScreen,
        steps: list[int] | None = None,
        number: int = 0,
    ) -> None:
        super().__init__(ctx)
        self.screen = screen
        self.round = number  # which round, from 0
        if steps is None:
            steps = [k for k in screen.steps if k not in screen.settled]
        self.steps = steps
        self.verdict = False  # every group settled: no step to blame
        self.out_of_budget = False

    def start(self) -> None:
        ctx, screen = self.ctx, self.screen
        screen.grouped = True
        # Few steps left: one group, to clear the quiet steps against (Shapley splits it).
        groups = split(self.steps, GROUP_WAYS) if len(self.steps) > GROUP_WAYS else [self.steps]
        quiet = sorted(k for k in screen.settled if k not in self.steps) if self.round else []
        self.game = GroupGame(
            [tuple(g) for g in groups] + ([tuple(quiet)] if quiet else []),
            ctx.alpha,
            salt=f"{ctx.spec.attribution_seed}/{self.round}",
            quiet=len(groups) if quiet else None,
            carry={k: screen.settled[k] for k in quiet},
            splits=len(groups) > 1 and screen.quiet_moved < QUIET_MOVES,
        )
        self.pending: dict[int, set[frozenset[int]]] = {}
        for spec, row in ctx.rows.of("groups", "held"):
            seed = self._seed(spec)
            if 0 <= seed < ROUND_SEEDS:
                self.game.observe(seed, coalition_of(spec), _flipped(row))

    def _seed(self, spec: ForkSpec) -> int:
        number, seed = round_seed(self.ctx, spec)
        return seed if number == self.round else -1

    def suggest(self, room: int) -> list[Fork] | None:
        """The next forks of the seeds in flight, then of new seeds: in blocks of
        SEEDS_IN_FLIGHT seeds, a block begun once every seed before it is done (so a job
        stopped by its cap, and run again, begins the seeds the job run in one go begins,
        wherever the cap fell); a seed is begun only if the forks the caps leave could
        finish it."""
        game = self.game
        if game.decided():
            return None
        left = self.ctx.forks_left()
        # Forks the seeds in flight still owe beyond those asked for.
        owed = sum(len(self._todo(seed)) for seed in self.pending)
        out: list[Fork] = []
        seed = first = game.next_seed()
        while len(out) < room:
            if seed in game.failed or game.complete(seed):
                seed += 1
                continue
            todo = self._todo(seed)
            if seed not in self.pending:
                if len(self.pending) >= SEEDS_IN_FLIGHT or seed - seed % SEEDS_IN_FLIGHT > first:
                    break  # seeds begin by blocks, once every block before is done
                if left is not None and left - len(out) - owed < len(todo):
                    self.out_of_budget = True  # what is left could not finish another seed
                    break
                owed += len(todo)
            for coalition in todo[: room - len(out)]:
                self.pending.setdefault(seed, set()).add(coalition)
                owed -= 1
                out.append(round_fork(self.ctx, self.round, seed, coalition))
            seed += 1
        if not out and not self.pending and self.out_of_budget:
            return None
        return out

    def _todo(self, seed: int) -> list[frozenset[int]]:
        """The seed's forks neither known nor asked for."""
        asked = self.pending.get(seed, set())
        game = self.game
        return [c for c in game.coalitions(seed) if not game.known(seed, c) and c not in asked]

    def _settle(self, spec: ForkSpec) -> tuple[int, frozenset[int]]:
        seed, coalition = self._seed(spec), coalition_of(spec)
        waiting = self.pending.get(seed)
        if waiting is not None:
            waiting.discard(coalition)
            if not waiting:
                del self.pending[seed]
        return seed, coalition

    @property
    def forks(self) -> int:
        """The forks of the round's own seeds, an earlier run's counted (`GroupGame.forks`)."""
        return self.game.forks()[0]

    def observe(self, row: Row) -> None:
        seed, coalition = self._settle(ForkSpec.model_validate_json(row["spec"]))
        self.game.observe(seed, coalition, _flipped(row))

    def unrun(self, spec: ForkSpec) -> None:
        seed, coalition = self._settle(spec)
        self.game.observe(seed, coalition, None)

    def done(self, exhausted: bool) -> Next:
        from ._shapley import HeldShapley  # the stage after this one; it hands back here

        game = self.game
        if not game.decided():
            return Next(end="budget_exhausted")
        cleared, left = self._outcome()
        self.screen.settle(cleared, len(game.seeds()), game.carry)
        quiet = game.quiet
        moved = quiet is not None and quiet in game.active()
        if moved:
            # Steps settled earlier changed the outcome after all: measured from now on.
            assert quiet is not None
            self.screen.unsettle(game.groups[quiet])
            self.screen.quiet_moved += 1
        if cleared:
            self.screen.rounds[self.round] = game  # a verdict may ask it to go on
        if not left:
            self.verdict = True
            return Next()
        new = self._fresh(cleared)
        if game.ended_to_split and new and len(left) <= GROUP_WAYS:
            # The round ended as soon as it knew what to split: the steps it settled have few
            # seeds, so one more round clears them against what is left, as one group.
            return Next(then=(HeldGroups(self.ctx, self.screen, left, self.round + 1),))
        if len(left) <= GROUP_WAYS or not (new or moved) or self.screen.quiet_moved > QUIET_MOVES:
            # Few steps left, or none newly cleared (every group changed the outcome:
            # splitting them again would play the same round), or the quiet steps moved more
            # than QUIET_MOVES times: Shapley measures them. The Shapley before the groups
            # is not an answer to fall back on: it was over steps since settled.
            for k in left:  # Shapley's candidates: the steps no round settled
                self.screen.hits[k] = max(1, self.screen.hits.get(k, 0))
            return Next(then=(HeldShapley(self.ctx, self.screen),))
        return Next(then=(HeldGroups(self.ctx, self.screen, left, self.round + 1),))

    def _outcome(self) -> tuple[list[int], list[int]]:
        """The steps the round cleared (their group changed the outcome in no counted seed)
        and those left (the others); none cleared while the round runs."""
        game = self.game
        if not game.decided():
            return [], sorted(self.steps)
        active = set(game.active())
        cleared = [k for g, steps in enumerate(game.groups) if g not in active for k in steps]
        left = [k for g, steps in enumerate(game.groups) if g in active for k in steps]
        return sorted(cleared), sorted(left)

    def _fresh(self, cleared: list[int]) -> list[int]:
        """The cleared steps this round settled first (not the quiet group's)."""
        return [k for k in cleared if k not in self.game.carry]

    def result(self) -> tuple[StageResult, ...]:
        out: list[StageResult] = [GroupsResult(notes=(self._note(),))]
        screen = screen_result(self.screen, ("separated", ()) if self.verdict else None)
        out.append(screen)
        if self.verdict:
            # No group changed the outcome: the job's answer is "no step to blame", over
            # whatever Shapley ran before the groups did.
            out.append(
                ShapleyResult(
                    candidates=(),
                    seeds=(),
                    per_seed_phi=np.zeros((0, 0)),
                    estimates=MappingProxyType({}),
                    verdict=("separated", ()),
                    screen=screen,
                )
            )
        return tuple(out)

    def _note(self) -> Note:
        """What this round did: its groups and seeds, what it cleared and what is left."""
        game = self.game
        seeds = len(game.seeds())
        quiet = [] if game.quiet is None else list(game.groups[game.quiet])
        own = len(game.groups) - (1 if quiet else 0)
        text = f"groups, round {self.round + 1}: steps {_span(self.steps)} in {own} group(s)"
        if quiet:
            text += f", and the {len(quiet)} steps earlier rounds cleared as one more"
        text += f", {seeds} seed(s) ({self.forks} forks)"
        cleared, left = self._outcome()
        if not game.decided():
            text += "; the budget ended before the round did"
        else:
            if game.ended_to_split:
                text += "; ended to split the groups that changed the outcome"
            new = self._fresh(cleared)
            if new:
                most = DeviationScreen.percent_after(seeds, self.ctx.alpha)
                text += (
                    f"; cleared on the outcome: steps {_span(new)} (re-drawing their "
                    f"group changed it in none of the {seeds} seeds: at "
                    f"{self.ctx.spec.confidence:.0%}, each such group's blame is at most "
                    f"{most}%)"
                )
            if game.quiet is not None and quiet[0] in cleared:
                fewest = game.carried(game.quiet) + seeds
                most = DeviationScreen.percent_after(fewest, self.ctx.alpha)
                text += (
                    f"; the steps cleared before stayed clear ({fewest} seeds or more each: "
                    f"their blame is at most {most}%)"
                )
            elif quiet:
                text += "; the steps cleared before changed it: they are measured again"
            text += f"; left to measure: {left}" if left else "; nothing left: no step to blame"
        return Note(
            kind="groups",
            text=text,
            figures={
                "round": self.round + 1,
                "forks": self.forks,
                "seeds": seeds,
                "groups": [list(g) for g in game.groups],
                "cleared": cleared,
                "left": left,
                "quiet": quiet,
            },
        )

    def state(self) -> dict[str, Any]:
        return {"round": self.round, "groups": [list(g) for g in self.game.groups]}


def round_fork(ctx: JobContext, number: int, seed: int, coalition: frozenset[int]) -> Fork:
    """The fork of round `number`'s seed `seed` that re-draws `coalition` (the rest held)."""
    plan: dict[int, Intervention] = {k: Resample() for k in coalition}
    fork_seed = GROUP_SEEDS + number * ROUND_SEEDS + seed
    key = tuple(sorted(coalition))
    return ("groups", ctx.seeds.fork("groups", key, plan, "held", fork_seed))


def round_seed(ctx: JobContext, spec: ForkSpec) -> tuple[int, int]:
    """Which round, and which seed of it, a fork of the group game belongs to."""
    return divmod(spec.seed - ctx.seeds.base - GROUP_SEEDS, ROUND_SEEDS)


class GoingOn:
    """The rounds of the group game that settled steps, going on when a verdict's clearance
    asks for more of those steps' draws (`Clearance.go_on`): more seeds of a round's chains,
    counted in order after its own (`GroupGame.extended`). Each counted seed in which a
    settled group's marginal is 0 is one more clean draw of each of its steps; one in which
    it is not unsettles the group (`DeviationScreen.unsettle`): its steps are candidates,
    and Shapley starts over with them."""

    def __init__(self, ctx: JobContext, screen: DeviationScreen) -> None:
        self.ctx = ctx
        self.screen = screen
        self.pending: dict[str, tuple[int, int, frozenset[int]]] = {}  # task id: where
        # What this stage's going on did, by round: seeds begun, steps unsettled.
        self.begun: dict[int, int] = {}
        self.unsettled: dict[int, list[int]] = {}
        # Rounds a fork of which did not run (refused, or its provider kept failing): they
        # go on no further here, as the next seed would take the failed one's place unasked.
        self.stopped: set[int] = set()

    def forks(self, number: int, more: int, room: int) -> list[Fork]:
        """Forks of round `number` going on until it counts `more` seeds more than it does
        (SEEDS_IN_FLIGHT at a time); a seed is begun only if the forks the caps leave could
        finish it."""
        if number in self.stopped:
            return []
        game = self.screen.rounds[number]
        asked = {(r, s, c) for r, s, c in self.pending.values()}
        left = self.ctx.forks_left()
        owed = sum(
            1
            for s in game.waiting()
            for c in game.coalitions(s)
            if not game.known(s, c) and (number, s, c) not in asked
        )
        goal = len(game.counted()) + more  # seeds in flight are among the slots
        while len(game.slots()) < goal and len(game.waiting()) < SEEDS_IN_FLIGHT:
            if left is not None and left - owed < len(game.groups):
                break  # what is left could not finish another seed
            game.extended += 1
            self.begun[number] = self.begun.get(number, 0) + 1
            seed = game.slots()[-1]
            owed += sum(1 for c in game.coalitions(seed) if not game.known(seed, c))
        self.reckon(number)  # a seed an earlier run (or the round) completed counts at once
        out: list[Fork] = []
        for seed in game.waiting():
            for coalition in game.coalitions(seed):
                if len(out) >= room:
                    return out
                if game.known(seed, coalition) or (number, seed, coalition) in asked:
                    continue
                fork = round_fork(self.ctx, number, seed, coalition)
                self.pending[fork[1].task_id] = (number, seed, coalition)
                out.append(fork)
        return out

    def observe(self, spec: ForkSpec, flipped: bool | None) -> None:
        number, seed, coalition = self.pending.pop(spec.task_id)
        if flipped is None:
            self.stopped.add(number)
        self.screen.rounds[number].observe(seed, coalition, flipped)
        self.reckon(number)

    def reckon(self, number: int) -> None:
        """The settled steps of round `number` after the seeds it counts: clean draws for
        those whose group stayed clear, candidates for those whose group did not."""
        game, screen = self.screen.rounds[number], self.screen
        broken = set(game.broken())
        n = len(game.counted())
        for g in game.settled():
            steps = [k for k in game.groups[g] if k in screen.settled]
            if g in broken:
                screen.unsettle(steps)
                self.unsettled.setdefault(number, []).extend(steps)
            else:
                screen.settle(steps, n, game.carry)

    def notes(self) -> list[Note]:
        """What each round that went on did: its seeds and forks, the seeds its settled
        steps now count, and the steps found not clear."""
        out = []
        for number in sorted(self.begun):
            game = self.screen.rounds[number]
            seeds = len(game.counted())
            forks = game.forks()[1]  # an earlier run's counted
            text = (
                f"groups, round {number + 1} went on for the clearance of the steps it "
                f"settled: {self.begun[number]} more seed(s) ({forks} forks), {seeds} counted"
            )
            back = sorted(self.unsettled.get(number, []))
            if back:
                text += f"; step(s) {_span(back)}: their group changed the outcome, measured now"
            out.append(
                Note(
                    kind="groups_on",
                    text=text,
                    figures={
                        "round": number + 1,
                        "seeds": self.begun[number],
                        "forks": forks,
                        "counted": seeds,
                        "unsettled": back,
                    },
                )
            )
        return out


def _span(steps: list[int]) -> str:
    """Steps as a list, or as ranges when they are many: a range ends where the steps skip
    more than their closest two do (a tape's model steps may be every other step)."""
    steps = sorted(steps)
    if len(steps) <= 6:
        return str(steps)
    gap = min(b - a for a, b in itertools.pairwise(steps))
    runs: list[list[int]] = [[steps[0]]]
    for a, b in itertools.pairwise(steps):
        if b - a > gap:
            runs.append([])
        runs[-1].append(b)
    text = ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    return f"{text} ({len(steps)} steps)"


def _flipped(row: Row) -> bool | None:
    return None if row["outcome"] is None else bool(row["flipped"])
