"""The shape of a stage (Ray Tune's `Searcher`): `suggest(room)` gives up to `room` forks to
run next, `[]` while it waits for rows of forks in flight, `None` when it is done;
`observe(row)` takes each row of its forks (and rows an earlier run of the job wrote, for the
forks it asks for again); `unrun(spec)` says a fork it asked for will not run (the budget
refused it, or its provider kept failing); `done(exhausted)` is called once nothing of it is
in flight and says what comes next (`Next`); `result()` hands back what it found, frozen and
typed; `state()` says where a running stage is (job.json's `stage`)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from ...execute import Row
from ...replay import ForkSpec
from .._context import JobContext
from .._interval import Interval
from .._results import StageResult

Fork = tuple[str, ForkSpec]  # (stage name, spec): what a stage suggests
# The leading cause while a job runs: a step and its blame so far (the live display's).
Lead = tuple[int, Interval]
UNSCORED = frozenset({"divergence", "error", "provider_error"})


@dataclass(frozen=True)
class Next:
    """What follows a stage: `then` runs before the rest of the plan; `end` ends the job now
    with that status. A stage that ended with the budget spent and says nothing ends the job
    `budget_exhausted`."""

    then: tuple[Stage, ...] = ()
    end: str | None = None


class Stage(Protocol):
    name: str

    def start(self) -> None: ...

    def suggest(self, room: int) -> list[Fork] | None: ...

    def observe(self, row: Row) -> None: ...

    def unrun(self, spec: ForkSpec) -> None: ...

    def done(self, exhausted: bool) -> Next: ...

    def result(self) -> tuple[StageResult, ...]: ...

    def state(self) -> dict[str, Any]: ...

    def lead(self) -> Lead | None: ...


class BaseStage:
    """Defaults: rows and unrun forks change nothing, the job goes on to the next stage, and
    the stage hands back nothing."""

    name = ""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx

    def start(self) -> None:
        return None

    def suggest(self, room: int) -> list[Fork] | None:
        return None

    def observe(self, row: Row) -> None:
        return None

    def unrun(self, spec: ForkSpec) -> None:
        return None

    def done(self, exhausted: bool) -> Next:
        return Next()

    def result(self) -> tuple[StageResult, ...]:
        return ()

    def state(self) -> dict[str, Any]:
        return {}

    def lead(self) -> Lead | None:
        return None


class Listed(BaseStage):
    """A stage whose forks are a list fixed when it starts (`forks`), `room` at a time."""

    def start(self) -> None:
        self._given = self.forks()

    def forks(self) -> Iterator[Fork]:
        return iter(())

    def suggest(self, room: int) -> list[Fork] | None:
        return list(itertools.islice(self._given, room)) or None
