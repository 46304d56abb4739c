"""The held screen: which steps ever choose differently."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ...execute import Row
from ...replay import ForkSpec, Intervention, Resample
from .._context import JobContext
from .._results import StageResult, Verdict
from .._tuning import SCREEN_FIRST, SCREEN_IN_FLIGHT, SHARE_FIRST
from ..estimators import DeviationScreen
from ._base import BaseStage, Fork, Next, Stage
from ._groups import HeldGroups, grouped
from ._screening import probed, screen_forks, screen_result
from ._shapley import HeldShapley


class HeldScreen(BaseStage):
    """Which steps ever choose differently: blocks of steps re-drawn together, held tail
    (see `DeviationScreen`), until the first step found or every step has its clean draws.
    Hands over to `HeldShapley` over the steps it found (to `HeldGroups` when they are
    GROUPS_FROM or more) once a screen fork has changed the outcome; until one has, it
    re-draws every step at once (the outcome check, `DeviationScreen.outcome`), and once so
    many such forks all kept the outcome that the bound they put on all steps' blame
    together is an interval [0, b] within the job's target, and never before SCREEN_CLEAN
    (`JobContext.clean_enough`), it says no step is to blame, every step settled on them.
    With none found, screens again to the first find or as many clean draws of every step
    (the same bound, on each step's rate of leaving the tape) before it says no step makes a
    choice (its result's verdict). With `arms` waiting for it (off the coupled provider) it
    does not stop at its first find but looks on until every step is found or cleared to
    SCREEN_FIRST, asks for the forks that re-draw each step it found alone at its recorded
    request up to SHARE_FIRST draws there (`DecisionShares`: the share the arms' couplings
    read; a step found at its first draw reads as rare, and its decision is then kept far
    too often; a fork that brings back no draw is not replaced), and runs them before
    whatever it hands over to (not before the group game, whose steps' words change at every
    draw)."""

    name = "screen"

    def __init__(
        self,
        ctx: JobContext,
        screen: DeviationScreen | None = None,
        *,
        arms: Stage | None = None,
    ) -> None:
        super().__init__(ctx)
        self.screen = screen
        self.verdict: Verdict | None = None
        # The arms stage that waits for the screen (off the coupled provider, `plan_of`): it
        # runs before whatever the screen hands over to.
        self.arms = arms
        # Forks in flight that re-draw one found step for its share: the step, by task id.
        self.sharing: dict[str, int] = {}

    def _then(self, *stages: Stage) -> Next:
        """Go on with `stages`, the waiting arms first."""
        return Next(then=(*((self.arms,) if self.arms is not None else ()), *stages))

    def start(self) -> None:
        ctx = self.ctx
        if self.screen is None:
            self.screen = DeviationScreen(ctx.resampled, clean_needed=SCREEN_FIRST)
            for spec, row in ctx.rows.of("screen", "held"):
                self._observe(spec, row)
            for spec, row in ctx.rows.of("shapley", "held"):
                probed(self.screen, spec, row)
        self.pending = 0

    @property
    def _screen(self) -> DeviationScreen:
        assert self.screen is not None
        return self.screen

    def _observe(self, spec: ForkSpec, row: Row) -> None:
        if row["outcome"] is not None:
            block = sorted(spec.interventions)
            self._screen.observe(block, row["first_deviation"])
            self._screen.outcome(block, bool(row["flipped"]))

    def _checking(self) -> bool:
        """Whether the outcome check goes on: a step is found, but no screen fork has changed
        the outcome, and fewer than `clean_enough` have re-drawn every step."""
        screen = self._screen
        enough = self.ctx.clean_enough
        return bool(screen.candidates) and not screen.moved and screen.whole < enough

    def suggest(self, room: int) -> list[Fork] | None:
        screen = self._screen
        if self._checking():
            # Forks of every step, one at a time at first (the first may well change it).
            most = 1 if screen.whole < SCREEN_FIRST else SCREEN_IN_FLIGHT
            most = min(most, self.ctx.clean_enough - screen.whole)
            out = screen_forks(self.ctx, screen, room, self.pending, most, whole=True)
            self.pending += len(out)
            return out
        if screen.done() or (screen.candidates and self.arms is None):
            # Once a step is found, Shapley's probes screen the rest; but arms waiting for
            # the screen (off the coupled provider) keep the decisions of the steps it has
            # found, so it looks for every one first, and reads their shares.
            return self._share_forks(room) if self.arms is not None else None
        # The first pass goes one fork at a time, so forks in flight do not all find the
        # same step; the second (nothing found yet) SCREEN_IN_FLIGHT at a time.
        first = screen.clean_needed < self.ctx.clean_enough
        # In flight at most the draws the step with fewest is still short of.
        short = screen.clean_needed - min((screen.clean.get(k, 0) for k in screen.steps), default=0)
        most = 1 if first else max(1, min(SCREEN_IN_FLIGHT, short))
        out = screen_forks(self.ctx, screen, room, self.pending, most)
        self.pending += len(out)
        return out

    def _share_forks(self, room: int) -> list[Fork] | None:
        """Forks that re-draw one found step alone (the rest held, so it is drawn at its
        recorded request), as many as bring each step the coupling keeps to SHARE_FIRST
        draws there, counting those in flight; `[]` while room is short, None once none is
        owed (a fork that comes back without a draw is not replaced). None where the job
        has no other arm, and before the group game (`grouped`)."""
        shares, screen = self.ctx.shares, self._screen
        others = any(a.kind != "resample" for a in self.ctx.arms)
        if shares is None or not others or grouped(self.ctx, screen):
            return None
        coupled = shares.coupling()
        flying = Counter(self.sharing.values())
        out: list[Fork] = []
        owed = False
        for k in screen.candidates:
            if k not in coupled:
                continue  # drawn live: its share is not read
            for _ in range(SHARE_FIRST - shares.draws(k) - flying[k]):
                if len(out) >= room:
                    owed = True
                    break
                plan: dict[int, Intervention] = {k: Resample()}
                spec = self.ctx.seeds.fork("screen", "block", plan, "held")
                out.append(("screen", spec))
                self.sharing[spec.task_id] = k
        self.pending += len(out)
        return out if out or owed else None

    def observe(self, row: Row) -> None:
        self.pending -= 1
        spec = ForkSpec.model_validate_json(row["spec"])
        self.sharing.pop(spec.task_id, None)
        self._observe(spec, row)

    def unrun(self, spec: ForkSpec) -> None:
        self.pending -= 1
        self.sharing.pop(spec.task_id, None)

    def done(self, exhausted: bool) -> Next:
        if exhausted:
            return Next(end="budget_exhausted")
        screen = self._screen
        if self._checking():
            return Next(then=(HeldScreen(self.ctx, screen, arms=self.arms),))
        if screen.candidates and not screen.moved:
            # Re-drawing every step kept the outcome as often as the target asks: nothing to
            # blame.
            screen.settle(screen.steps, screen.whole)
            self.verdict = ("separated", ())
            return self._then()
        if screen.candidates:
            if grouped(self.ctx, screen):
                return self._then(HeldGroups(self.ctx, screen))
            return self._then(HeldShapley(self.ctx, screen))
        if screen.clean_needed >= self.ctx.clean_enough:
            self.verdict = ("separated", ())
            return self._then()
        # Nothing found yet: clear every step as the target asks before saying so.
        screen.clean_needed = self.ctx.clean_enough
        return Next(then=(HeldScreen(self.ctx, screen, arms=self.arms),))

    def result(self) -> tuple[StageResult, ...]:
        return (screen_result(self._screen, self.verdict),)

    def state(self) -> dict[str, Any]:
        screen = self._screen
        return {"candidates": screen.candidates, "clean_needed": screen.clean_needed}
