"""What the screen stage and the Shapley stage share of the deviation screen: its next forks,
the draws of Shapley forks that probed for it, and its frozen result."""

from __future__ import annotations

from types import MappingProxyType

from ...execute import Row
from ...replay import ForkSpec, Intervention, Resample
from .._context import JobContext, probes_of
from .._results import ScreenResult, Verdict
from .._tuning import SCREEN_IN_FLIGHT
from ..estimators import DeviationScreen
from ._base import Fork


def screen_forks(
    ctx: JobContext,
    screen: DeviationScreen,
    room: int,
    pending: int,
    most: int = SCREEN_IN_FLIGHT,
    whole: bool = False,
) -> list[Fork]:
    """Up to `room` forks of the screen's block (at most `most` in flight); with `whole`, of
    every step it screens (`DeviationScreen.outcome`)."""
    if whole:
        block = list(screen.steps)
    elif screen.done():  # every step cleared, or it gave up on strays
        return []
    else:
        block = screen.block()
    plan: dict[int, Intervention] = {k: Resample() for k in block}
    n = max(0, min(room, most - pending))
    return [("screen", ctx.seeds.fork("screen", "block", plan, "held")) for _ in range(n)]


def probed(screen: DeviationScreen, spec: ForkSpec, row: Row) -> None:
    """A scored fork's probes, to the screen (`DeviationScreen.probed`)."""
    probes = probes_of(spec)
    if probes and row["outcome"] is not None:
        screen.probed(spec.seed, probes, row["first_deviation"])


def screen_result(screen: DeviationScreen, verdict: Verdict | None = None) -> ScreenResult:
    """The screen as it stands, frozen."""
    return ScreenResult(
        steps=tuple(screen.steps),
        candidates=tuple(screen.candidates),
        clean=MappingProxyType(dict(screen.clean)),
        forks=screen.forks,
        probe_forks=screen.probe_forks,
        strays=screen.strays,
        clean_needed=screen.clean_needed,
        verdict=verdict,
        settled=MappingProxyType(dict(screen.settled)),
        whole=screen.whole,
        moved=screen.moved,
    )
