"""What the provider does with a recorded draw's seed, asked before a job's forks."""

from __future__ import annotations

from collections import deque
from typing import Any

import structlog

from ..._notes import Note
from ...execute import Row
from ...replay import ForkSpec, Intervention, Reask
from ...tape import LlmEvent
from .._results import DrawsResult, StageResult
from .._tuning import DRAWS_STEPS
from ._base import BaseStage, Fork, Next

log = structlog.get_logger("car_ray.schedule")

# What each finding means for the counterfactual the job computes, for its note.
_MEANING = {
    "replays": "it answers an identical request with the recorded seed as recorded, and a "
    "changed request is a new sample",
    "fresh": "it answered a recorded request, re-asked with its recorded seed, otherwise than "
    "the tape: no draw is replayed",
    "unknown": "no step re-asked told it twice (the recorded seed answering as recorded "
    "where a fresh one did not), so whether it replays a draw is not known; the job assumes "
    "it does not",
    "unsent": "car-ray gives its seed to the simulated provider only (in a header no API "
    "reads), so a live provider draws every re-asked request afresh",
}


def _continues(event: object) -> bool:
    body = event.request.body if isinstance(event, LlmEvent) else None
    return isinstance(body, dict) and body.get("previous_response_id") is not None


class ProviderDraws(BaseStage):
    """Whether the provider replays a draw. A job on the simulated provider drawing as a
    real one does (`sim_draws` seeded or unseeded) re-asks a model step's recorded request
    twice (`Reask`), with the recorded draw's seed and with a fresh one, the last model step
    first (never one whose request continues a recorded Responses answer) and at most
    DRAWS_STEPS steps: the recorded seed answering otherwise than the tape is a provider that
    does not replay draws (`fresh`); the recorded seed answering word for word where the
    fresh one does not is a vote for one that does, and the same step is asked again: two
    votes are a provider that replays draws (`replays`). One vote is not: a provider that
    replays nothing gives one by chance where the recorded answer is likely (a step whose
    recorded answer has probability p votes with probability p (1 - p), up to 1/4). A step
    that answers the same to both says nothing (it may not vary), and the next earlier one
    is asked. A job on a live provider (`base_url`) asks nothing: car-ray's seed is a
    header only the simulated provider reads, so its draws are `fresh`. Either way the job
    computes the same thing: a held step keeps its recorded answer while its request is the
    recorded one; once it changed (no provider but the coupled simulated one lands a
    changed request on the recorded draw's point) a step seen to choose keeps its decision
    as an estimated maximal coupling would (`coupling` "estimated", `replay.Run._coupled`)
    and any other draws live; the finding goes into the answer and the verdict says so.
    Hands back `DrawsResult`."""

    name = "draws"

    def start(self) -> None:
        steps = self.ctx.tape.steps
        self._unsent = self.ctx.spec.provider.base_url is not None
        # A Responses request that continues a recorded answer is sent with its conversation
        # spelled out (a fork's provider never gave that answer): never the recorded bytes.
        model = [
            k
            for k in range(len(steps) - 1, -1, -1)
            if isinstance(steps[k], LlmEvent) and not _continues(steps[k])
        ]
        self._steps = deque(model[:DRAWS_STEPS])
        self._queue: deque[Fork] = deque()
        self._pending: dict[str, str] = {}  # task id -> "recorded" | "fresh"
        self._answers: dict[str, bool | None] = {}
        self._asked = 0
        self._votes = 0  # steps' re-asks that answered as a provider replaying draws would
        self._step: tuple[int, int] | None = None  # the step asked and its round there
        self._found: str | None = None if self._steps else "unknown"
        if self._unsent:
            # No seed reaches it: a re-ask could only show chance, at a price.
            self._steps.clear()
            self._found = "fresh"

    def suggest(self, room: int) -> list[Fork] | None:
        if not self._queue and not self._pending:
            if self._found is not None or (self._step is None and not self._steps):
                return None
            if self._step is None:
                self._step = (self._steps.popleft(), 0)
            k, again = self._step
            self._answers = {}
            for j, seed in enumerate(("recorded", "fresh")):
                plan: dict[int, Intervention] = {k: Reask(seed=seed)}
                spec = self.ctx.seeds.fork("draws", f"reask@{k}", plan, "held", 2 * again + j)
                self._pending[spec.task_id] = seed
                self._queue.append(("draws", spec))
        given: list[Fork] = []
        while self._queue and len(given) < room:
            given.append(self._queue.popleft())
        return given

    def observe(self, row: Row) -> None:
        seed = self._pending.pop(row["task_id"], None)
        if seed is None:
            return
        self._asked += 1
        self._answers[seed] = row["reproduced"]
        self._settle()

    def unrun(self, spec: ForkSpec) -> None:
        if self._pending.pop(spec.task_id, None) is not None:
            self._settle()

    def _settle(self) -> None:
        """Once a step's two re-asks are in (or will not run), what they showed."""
        if self._pending or self._queue:
            return
        recorded, fresh = self._answers.get("recorded"), self._answers.get("fresh")
        asked, self._step = self._step, None
        if recorded is False:
            self._found = "fresh"
        elif recorded and fresh is False:
            self._votes += 1
            if self._votes >= 2:
                self._found = "replays"
            elif asked is not None:
                self._step = (asked[0], asked[1] + 1)  # the same step again
        # Both the same, or a re-ask that never answered: the next step is asked.

    def done(self, exhausted: bool) -> Next:
        if self._found is None:
            self._found = "unknown"
        log.info("provider_draws", found=self._found, reasks=self._asked)
        return Next(end="budget_exhausted") if exhausted else Next()

    def result(self) -> tuple[StageResult, ...]:
        found = self._found or "unknown"
        how = (
            _MEANING["unsent"]
            if self._unsent
            else f"{_MEANING[found]} (found in {self._asked} re-ask(s), counted in the budget)"
        )
        note = Note(
            kind="provider_draws",
            severity="info" if found == "replays" else "warning",
            text=f"the provider does not couple draws: {how}. A held step keeps its "
            "recorded answer while its request is the recorded one"
            + (", decision for decision" if self.ctx.spec.hold == "decisions" else "")
            + (
                "; once it changed, a step seen to choose keeps its decision as an estimated "
                "maximal coupling would and any other draws live: steps before a cause may "
                "share a little of its blame"
                if self.ctx.spec.coupling == "estimated"
                else ", and draws live once it changed: steps before a cause may share its blame"
            ),
            figures={"reasks": self._asked},
        )
        return (DrawsResult(found, self._asked, (note,)),)

    def state(self) -> dict[str, Any]:
        return {"reasks": self._asked, "votes": self._votes, "found": self._found}
