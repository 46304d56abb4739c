"""The held screen: which steps ever choose differently."""

from __future__ import annotations

from typing import Any

from ...execute import Row
from ...replay import ForkSpec
from .._context import JobContext
from .._results import StageResult, Verdict
from .._tuning import SCREEN_CLEAN, SCREEN_FIRST, SCREEN_IN_FLIGHT
from ..estimators import DeviationScreen
from ._base import BaseStage, Fork, Next
from ._groups import HeldGroups, grouped
from ._screening import probed, screen_forks, screen_result
from ._shapley import HeldShapley


class HeldScreen(BaseStage):
    """Which steps ever choose differently: blocks of steps re-drawn together, held tail
    (see `DeviationScreen`), until the first step found or every step has its clean draws.
    Hands over to `HeldShapley` over the steps it found (to `HeldGroups` when they are
    GROUPS_FROM or more); with none found, screens again to
    the first find or SCREEN_CLEAN before it says no step makes a choice (its result's
    verdict)."""

    name = "screen"

    def __init__(self, ctx: JobContext, screen: DeviationScreen | None = None) -> None:
        super().__init__(ctx)
        self.screen = screen
        self.verdict: Verdict | None = None

    def start(self) -> None:
        ctx = self.ctx
        if self.screen is None:
            self.screen = DeviationScreen(ctx.resampled, clean_needed=SCREEN_FIRST)
            for spec, row in ctx.rows.of("screen", "held"):
                if row["outcome"] is not None:
                    self.screen.observe(sorted(spec.interventions), row["first_deviation"])
            for spec, row in ctx.rows.of("shapley", "held"):
                probed(self.screen, spec, row)
        self.pending = 0

    @property
    def _screen(self) -> DeviationScreen:
        assert self.screen is not None
        return self.screen

    def suggest(self, room: int) -> list[Fork] | None:
        screen = self._screen
        if screen.done() or screen.candidates:
            # Once a step is found, Shapley's probes screen the rest.
            return None
        # The first pass goes one fork at a time, so forks in flight do not all find the
        # same step; the second (nothing found yet) SCREEN_IN_FLIGHT at a time.
        first = screen.clean_needed < SCREEN_CLEAN
        out = screen_forks(self.ctx, screen, room, self.pending, 1 if first else SCREEN_IN_FLIGHT)
        self.pending += len(out)
        return out

    def observe(self, row: Row) -> None:
        self.pending -= 1
        if row["outcome"] is not None:
            spec = ForkSpec.model_validate_json(row["spec"])
            self._screen.observe(sorted(spec.interventions), row["first_deviation"])

    def unrun(self, spec: ForkSpec) -> None:
        self.pending -= 1

    def done(self, exhausted: bool) -> Next:
        if exhausted:
            return Next(end="budget_exhausted")
        screen = self._screen
        if screen.candidates:
            if grouped(self.ctx, screen):
                return Next(then=(HeldGroups(self.ctx, screen),))
            return Next(then=(HeldShapley(self.ctx, screen),))
        if screen.clean_needed >= SCREEN_CLEAN:
            self.verdict = ("separated", ())
            return Next()
        # Nothing found yet: clear every step to SCREEN_CLEAN before saying so.
        screen.clean_needed = SCREEN_CLEAN
        return Next(then=(HeldScreen(self.ctx, screen),))

    def result(self) -> tuple[StageResult, ...]:
        return (screen_result(self._screen, self.verdict),)

    def state(self) -> dict[str, Any]:
        screen = self._screen
        return {"candidates": screen.candidates, "clean_needed": screen.clean_needed}
