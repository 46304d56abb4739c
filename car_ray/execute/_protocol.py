"""The seams of the run loop: an `Executor` takes `Item`s and gives back rows (or `BatchLost`);
a `RowSink` keeps the rows. `RayExecutor` and `LocalExecutor` are executors; `ForkSink` (the
Parquet writer) is a sink. Neither side imports Ray: a new executor is one small class."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Required, TypedDict

from ..replay import ForkRunner, ForkSpec, SpendLimit

# A fork's row as plain data: `ForkRow`'s fields and the executor's `job_id`, `stage`, `spec`
# (the `ForkSpec` as JSON), `worker` and `attempt`; the run loop adds `finished_at`.
# `car_ray.results.ForkRecord` is its typed model, and the Parquet schema derives from it.
Row = dict[str, Any]


@dataclass(frozen=True)
class Item:
    """One fork to run: the spec and its hard spend ceiling (its budget reservation), and
    the job it is of (its row comes back with it: the run loop routes rows by job)."""

    spec: ForkSpec
    stage: str
    attempt: int = 0
    limit: SpendLimit = field(default_factory=SpendLimit)
    job_id: str = ""


class BatchLost(Exception):
    """A batch whose worker died before answering: none of its rows are known."""

    def __init__(self, items: list[Item], cause: BaseException) -> None:
        self.items = items
        self.cause = cause
        super().__init__(f"{len(items)} forks lost with their worker: {cause!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.items, self.cause), self.__dict__)


class Verified(TypedDict, total=False):
    """The tape replayed once ($0): `ok` with the scorer's `recorded_outcome`, or not ok with
    the `divergence` (rendered) that stopped the replay."""

    ok: Required[bool]
    recorded_outcome: float
    divergence: str


class Executor(Protocol):
    """Runs forks. `submit` hands them over; `wait` returns what finished since (each batch's
    rows, or `BatchLost` for a batch none of whose rows are known, for the caller to run
    again under a new reservation); `in_flight` counts forks submitted and not yet returned;
    `verify` replays a tape before any fork runs."""

    @property
    def in_flight(self) -> int: ...

    def submit(self, items: Sequence[Item]) -> None: ...

    def wait(self, timeout_s: float = 0.5) -> Iterable[list[Row] | BatchLost]: ...

    def verify(self, tape_id: str) -> Verified: ...


class RowSink(Protocol):
    """Keeps fork rows: `add` is False for a task id it already holds (the row is still the
    fork's result, not a new one); `maybe_flush` writes when due, `flush` now."""

    def add(self, row: Row) -> bool: ...

    def maybe_flush(self) -> object: ...

    def flush(self) -> object: ...


async def run_item(
    runner: ForkRunner, item: Item, worker: str, spec_json: str | None = None
) -> Row:
    """Run one fork on `runner` and return its row as an executor hands it back. A fork that
    raises is an error row, not a lost batch: its neighbours finished."""
    try:
        row = await runner.run(item.spec, item.limit)
    except Exception as exc:
        row = runner.error_row(item.spec, f"{type(exc).__name__}: {exc}")
    return {
        **row.model_dump(),
        "job_id": item.job_id,
        "stage": item.stage,
        "spec": spec_json if spec_json is not None else item.spec.model_dump_json(),
        "worker": worker,
        "attempt": item.attempt,
    }
