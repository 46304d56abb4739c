"""The negative control of the held mechanism."""

from __future__ import annotations

from collections.abc import Iterator

import structlog

from ..._notes import Note
from .._results import ControlResult, StageResult
from ._base import UNSCORED, Fork, Listed, Next

log = structlog.get_logger("car_ray.schedule")

CONTROL_HINT = (
    "the agent is not deterministic under replay. Usual causes: a client or cache shared "
    "across concurrent runs (a module-level SDK client, a global conversation list), ids or "
    "timestamps in request bodies not taken from ctx.now / ctx.uuid4, randomness not from "
    "ctx.random. Check: `car-ray fork TAPE --job JOB.toml --step 0 --tail pinned` twice; "
    "both rows must show the tape's outcome and no divergence"
)


class HeldControl(Listed):
    """The negative control: nothing intervened, every step held. It must reproduce the
    recorded outcome (with a seed-honouring provider it is the replay: no live call); if it
    does not, the job ends `control_failed` (every fork after it would measure the agent's
    nondeterminism, not its steps)."""

    name = "controls"

    def start(self) -> None:
        super().start()
        self._result = ControlResult(failed=False)

    def forks(self) -> Iterator[Fork]:
        return iter([("controls", self.ctx.seeds.fork("controls", "held", {}, "held", 0))])

    def done(self, exhausted: bool) -> Next:
        rows = [r for _, r in self.ctx.rows.of("controls", "held")]
        bad = [r for r in rows if r["outcome"] != r["recorded_outcome"]]
        # A control that never ran (its provider failed every try) controls nothing.
        missing = not rows and not exhausted
        if missing or bad or any(r["status"] in UNSCORED | {"budget_cut"} for r in rows):
            what = (
                rows[0]["divergence"] or rows[0]["error"]
                if rows
                else "it never ran: its provider failed every try"
            )
            note = Note(
                kind="control_failed",
                severity="error",
                text="NEGATIVE CONTROL FAILED: the fork that changes nothing did not reproduce "
                f"the recorded outcome{f' ({what})' if what else ''}; {CONTROL_HINT}",
            )
            self._result = ControlResult(failed=True, notes=(note,))
            log.warning("control_failed", status=rows[0]["status"] if rows else None)
        if exhausted:
            return Next(end="budget_exhausted")
        return Next(end="control_failed") if self._result.failed else Next()

    def result(self) -> tuple[StageResult, ...]:
        return (self._result,)
