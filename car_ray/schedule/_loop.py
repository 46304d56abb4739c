"""The one run loop: forks from many jobs at once, through small admission policies, to one
executor; each row back to its job's stage, sink and ledger.

A job is a `JobSource` (the `Scheduler` is the one there is): its current stage suggests forks,
its ledger reserves each one (learned reservations are the job's), and the loop runs them and
settles them. A lost batch is run again under a new reservation (the lost attempt counted as
spent); a `provider_error` row is kept under `<task>/p<n>` and the fork runs again, at most
PROVIDER_ATTEMPTS times; a fork cut at a learned reservation is kept under `<task>/cut` and
runs again at the worst case. A fork refused while others are in flight waits (reservations
are upper bounds: settling them may make room); refused with nothing in flight, its stage has
spent the budget.

Admission policies (the shape of Ray Data's backpressure policies) each answer "may more
start?": `room` caps how many forks may start now across every job (`Window`), `admit` may
refuse a fork its job's own ledger took (`SharedBudget`: one ledger over every job;
`Deadline`: wall time). The loop ANDs them; a job's own window is its provider's concurrency.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from .._notes import Note
from ..execute import BatchLost, Executor, Item, Row, RowSink
from ..replay import ForkSpec
from ._budget import Budget, BudgetGovernor, Cost, ReservationExceeded
from ._tuning import PROVIDER_ATTEMPTS, PROVIDER_DOWN_FORKS, WAIT_S

log = structlog.get_logger("car_ray.schedule")


# A policy's verdict on one fork: its job id, its ledger key in that job, its reservation.
Gate = Callable[[str, Cost], bool]


class Admission(Protocol):
    """One admission policy: `room` (forks that may start now across every job, None for no
    limit), `admit` (a fork its job's ledger reserved may start), `settle`/`lose` (a fork
    `admit`ted ended with a row, or was lost with its worker)."""

    def room(self, in_flight: int) -> int | None: ...

    def admit(self, job_id: str, key: str, estimate: Cost) -> bool: ...

    def settle(self, job_id: str, key: str, actual: Cost) -> None: ...

    def lose(self, job_id: str, key: str) -> None: ...


class Policy:
    """A policy that limits nothing: subclasses override what they limit."""

    def room(self, in_flight: int) -> int | None:
        return None

    def admit(self, job_id: str, key: str, estimate: Cost) -> bool:
        return True

    def settle(self, job_id: str, key: str, actual: Cost) -> None:
        return None

    def lose(self, job_id: str, key: str) -> None:
        return None


class Window(Policy):
    """At most `forks` in flight across every job (the worker pool's share)."""

    def __init__(self, forks: int) -> None:
        self.forks = forks

    def room(self, in_flight: int) -> int | None:
        return self.forks - in_flight


class SharedBudget(Policy):
    """One ledger over every job (a batch's or a sweep's cap): a fork starts only if it fits
    here as well as in its job's own ledger."""

    def __init__(
        self, budget: Budget, *, already_spent: Cost = Cost(), carried: Cost = Cost()
    ) -> None:
        self.governor = BudgetGovernor(budget, already_spent=already_spent, carried=carried)
        self.overspent: list[str] = []

    def admit(self, job_id: str, key: str, estimate: Cost) -> bool:
        return self.governor.try_reserve(f"{job_id}/{key}", estimate)

    def settle(self, job_id: str, key: str, actual: Cost) -> None:
        try:
            self.governor.settle(f"{job_id}/{key}", actual)
        except ReservationExceeded as exc:
            self.overspent.append(str(exc))
            log.warning("reservation_exceeded", job=job_id, key=key, error=str(exc))

    def lose(self, job_id: str, key: str) -> None:
        self.governor.lose(f"{job_id}/{key}")


class Deadline(Policy):
    """No fork starts after `seconds` of wall time from the policy's creation; forks in
    flight settle."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.until = clock() + seconds

    def admit(self, job_id: str, key: str, estimate: Cost) -> bool:
        return self.clock() < self.until


class JobSource(Protocol):
    """What the loop needs of a job: its current stage (`suggest`, `observe`, `unrun`,
    `stage_ended`), its ledger and reservations, its sink, and its row bookkeeping."""

    job_id: str
    governor: BudgetGovernor
    sink: RowSink
    notes: list[Note]
    attempts: dict[str, int]
    rows_by_task: dict[str, dict[str, Any]]
    provider_failed: Counter[str]
    given_up: int
    live_answers: int
    provider_down: bool

    @property
    def window(self) -> int: ...

    def begin(self) -> bool: ...

    def suggest(self, room: int) -> list[tuple[str, ForkSpec]] | None: ...

    def observe(self, row: Row) -> None: ...

    def unrun(self, spec: ForkSpec) -> None: ...

    def stage_ended(self, exhausted: bool) -> bool: ...

    def reserve(
        self, stage: str, spec: ForkSpec, attempt: int, *, worst: bool, gate: Gate
    ) -> tuple[Item, str] | None: ...

    def learned(self, key: str) -> bool: ...

    def keep_attempt(self, row: Row, suffix: str) -> ForkSpec: ...

    def remember(self, row: Row) -> None: ...

    def submitted(self, forks: int) -> None: ...

    def received(self, rows: int = 0, lost: int = 0) -> None: ...

    def in_flight_now(self, forks: int) -> None: ...

    def tick(self) -> None: ...


@dataclass
class _Slot:
    """A job in the loop, and its current stage's state."""

    source: JobSource
    in_flight: int = 0  # its forks submitted and not yet returned
    keys: dict[str, str] = field(default_factory=dict)  # task id -> ledger key, in flight
    queue: list[Item] = field(default_factory=list)  # reserved, to submit
    # Forks refused while others were in flight: settling those may free room.
    waiting: list[tuple[str, ForkSpec]] = field(default_factory=list)
    exhausted: bool = False  # the stage met a refusal with nothing in flight
    stage_done: bool = False  # the stage said None
    stuck: bool = False  # the stage was asked and wanted nothing, with nothing in flight
    refused_here: bool = False  # the last refusal was a policy's, not the job's ledger
    finished: bool = False

    def next_stage(self) -> None:
        self.keys.clear()
        self.queue.clear()
        self.waiting = []
        self.exhausted = self.stage_done = self.stuck = self.refused_here = False


class RunLoop:
    """Runs jobs (`add`) to their end on one executor (`run`), under `policies`. At most
    `max_active` jobs are begun at once (the rest wait in order: a batch of 500 traces keeps
    a few dozen in flight, enough to fill the window); `on_done` hears of each job as it
    finishes, and the loop forgets it."""

    def __init__(
        self,
        executor: Executor,
        policies: list[Admission] | None = None,
        *,
        max_active: int | None = None,
        on_done: Callable[[JobSource], None] | None = None,
        on_wait: Callable[[], None] | None = None,
        feed: Callable[[], JobSource | None] | None = None,
    ) -> None:
        self.executor = executor
        self.policies: list[Admission] = list(policies or [])
        self.slots: dict[str, _Slot] = {}
        self.pending: list[JobSource] = []
        self.max_active = max_active
        self.on_done = on_done or (lambda source: None)
        self.on_wait = on_wait or (lambda: None)
        # More jobs, made when there is room for them (a batch's next trace: its share of
        # the budget is set then); None when there are no more.
        self.feed = feed
        self.stopped = False
        self._turn = 0

    def add(self, source: JobSource) -> None:
        if source.job_id in self.slots or any(p.job_id == source.job_id for p in self.pending):
            raise ValueError(f"job {source.job_id!r} is in this run loop already")
        self.pending.append(source)

    def stop(self) -> None:
        """Begin no more jobs: those begun run to their end (their stages see the refusals
        of their own ledgers)."""
        self.stopped = True

    def _activate(self) -> None:
        """Begin waiting jobs (then `feed`'s) while fewer than `max_active` run."""
        while not self.stopped:
            if self.max_active is not None and len(self.slots) >= self.max_active:
                return
            if self.pending:
                source = self.pending.pop(0)
            else:
                fed = self.feed() if self.feed is not None else None
                if fed is None:
                    self.feed = None
                    return
                source = fed
            slot = self.slots[source.job_id] = _Slot(source)
            slot.finished = not source.begin()

    def _retire(self) -> None:
        for job_id, slot in list(self.slots.items()):
            if slot.finished:
                del self.slots[job_id]
                self.on_done(slot.source)

    def run(self) -> None:
        """Run every job added until its plan ends (or its budget does)."""
        while True:
            self._activate()
            self._retire()
            active = [s for s in self.slots.values() if not s.finished]
            if not active:
                if (self.pending or self.feed is not None) and not self.stopped:
                    continue
                return
            # Each job in turn first, so no job always fills a shared window before another.
            self._turn = (self._turn + 1) % len(active)
            for slot in active[self._turn :] + active[: self._turn]:
                self._admit(slot)
            self._retire()
            if self.executor.in_flight == 0:
                continue
            for slot in active:
                if slot.in_flight:
                    slot.source.in_flight_now(slot.in_flight)
            self.on_wait()
            for result in self.executor.wait(WAIT_S):
                if isinstance(result, BatchLost):
                    for item in result.items:
                        self._lost(item)
                    continue
                for row in result:
                    self._row(row)
            for slot in active:
                if not slot.finished:
                    slot.source.sink.maybe_flush()
                    slot.source.tick()

    # -- admission ------------------------------------------------------------------------------

    def _admit(self, slot: _Slot) -> None:
        """Ask the slot's stage for what the windows leave room for, reserve and submit it;
        move on to the next stage while the stage has ended with nothing in flight."""
        while not slot.finished:
            self._ask(slot)
            if slot.in_flight:
                return
            if slot.exhausted or (slot.stage_done and not slot.waiting) or slot.stuck:
                slot.finished = slot.source.stage_ended(slot.exhausted)
                slot.next_stage()
                continue
            return

    def _room(self, slot: _Slot) -> int:
        room = slot.source.window - slot.in_flight - len(slot.queue)
        queued = sum(len(s.queue) for s in self.slots.values())
        for policy in self.policies:
            left = policy.room(self.executor.in_flight + queued)
            if left is not None:
                room = min(room, left)
        return room

    def _ask(self, slot: _Slot) -> None:
        source = slot.source
        room = self._room(slot)
        slot.stuck = False
        if not slot.exhausted and room > 0 and (slot.waiting or not slot.stage_done):
            if slot.waiting:
                batch, slot.waiting = slot.waiting, []
            else:
                got = source.suggest(room)
                slot.stage_done = got is None
                batch = got or []
                # The stage wants nothing and nothing is in flight: it cannot progress.
                slot.stuck = not batch and not slot.in_flight and not slot.queue
            for i, (stage, spec) in enumerate(batch):
                task = spec.task_id
                if task in source.rows_by_task:  # written by an earlier run of this job
                    source.observe(source.rows_by_task[task])
                    continue
                item = self._reserve(slot, stage, spec, source.attempts.get(task, 0))
                if item is None:
                    if slot.in_flight or slot.queue or self._others_may_free(slot):
                        slot.waiting = batch[i:]
                    else:
                        slot.exhausted = True
                        for _, unrun in batch[i:]:
                            source.unrun(unrun)
                    break
                slot.queue.append(item)
            if slot.waiting:
                slot.stuck = False
        if slot.queue:
            # The ledger reaches job.json before the forks reach a worker: a driver killed
            # now leaves a successor that counts them as (possibly) spent.
            source.submitted(len(slot.queue))
            self.executor.submit(slot.queue)
            slot.in_flight += len(slot.queue)
            slot.queue = []

    def _others_may_free(self, slot: _Slot) -> bool:
        """A policy refused the fork and another job's forks are in flight: they may free
        room in a shared ledger."""
        return slot.refused_here and self.executor.in_flight > 0

    def _reserve(
        self, slot: _Slot, stage: str, spec: ForkSpec, attempt: int, *, worst: bool = False
    ) -> Item | None:
        job_id = slot.source.job_id
        slot.refused_here = False

        def gate(key: str, estimate: Cost) -> bool:
            admitted: list[Admission] = []
            for policy in self.policies:
                if not policy.admit(job_id, key, estimate):
                    for taken in admitted:  # pragma: no cover - two budgets in one loop
                        taken.lose(job_id, key)
                    slot.refused_here = True
                    return False
                admitted.append(policy)
            return True

        got = slot.source.reserve(stage, spec, attempt, worst=worst, gate=gate)
        if got is None:
            return None
        item, key = got
        slot.keys[spec.task_id] = key
        return item

    def _again(self, slot: _Slot, stage: str, spec: ForkSpec, attempt: int, worst: bool) -> None:
        """Run a fork once more under a new ledger key (its last attempt is settled or lost).
        Refused, it waits while any reservation is open: rows of this result not yet
        settled, forks in flight or queued may free room."""
        source = slot.source
        source.attempts[spec.task_id] = attempt + 1
        retry = self._reserve(slot, stage, spec, attempt + 1, worst=worst)
        if retry is not None:
            slot.queue.append(retry)
        elif source.governor.in_flight or self._others_may_free(slot):
            slot.waiting.append((stage, spec))
        else:
            slot.exhausted = True
            source.unrun(spec)

    # -- results ------------------------------------------------------------------------------

    def _slot_of(self, job_id: str | None) -> _Slot:
        if job_id in self.slots:
            return self.slots[job_id]
        if len(self.slots) == 1:  # an executor that does not echo the job: there is one
            return next(iter(self.slots.values()))
        raise RuntimeError(f"a row of job {job_id!r}, which is not in this run loop")

    def _lost(self, item: Item) -> None:
        slot = self._slot_of(item.job_id)
        slot.in_flight -= 1
        slot.source.received(lost=1)
        key = slot.keys.pop(item.spec.task_id)
        slot.source.governor.lose(key)
        for policy in self.policies:
            policy.lose(slot.source.job_id, key)
        self._again(slot, item.stage, item.spec, item.attempt, worst=False)

    def _row(self, row: Row) -> None:
        slot = self._slot_of(row.get("job_id"))
        source = slot.source
        slot.in_flight -= 1
        row["job_id"] = source.job_id
        row["finished_at"] = datetime.now(UTC)
        ledger_key = slot.keys.pop(row["task_id"])
        cost = Cost(1, row["cost_usd"], row["tokens_in"] + row["tokens_out"])
        for policy in self.policies:
            policy.settle(source.job_id, ledger_key, cost)
        try:
            source.governor.settle(ledger_key, cost)
        except ReservationExceeded as exc:
            # The ledger has the true spend; say so rather than stop the job.
            source.notes.append(Note(kind="overspent", severity="error", text=f"OVERSPENT: {exc}"))
            log.warning("reservation_exceeded", task=row["task_id"], error=str(exc))
        if row["status"] == "budget_cut" and source.learned(ledger_key):
            # The learned reservation was too small for this one: keep its row (it was
            # paid for) and run it again at the worst case.
            spec = source.keep_attempt(row, "cut")
            self._again(slot, row["stage"], spec, row["attempt"], worst=True)
            return
        if row.get("tail_calls"):  # this run's answered live calls (a failed one is not one)
            source.live_answers += 1
        if row["status"] == "provider_error":
            failures = source.provider_failed[row["task_id"]]
            spec = source.keep_attempt(row, f"p{failures}")
            if failures + 1 >= PROVIDER_ATTEMPTS:
                # Its next attempt (if a stage asks again) has a fresh key.
                source.attempts[spec.task_id] = row["attempt"] + 1
                source.given_up += 1
                source.notes.append(
                    Note(
                        kind="gave_up",
                        severity="warning",
                        text=f"gave up a fork after {PROVIDER_ATTEMPTS} provider failures "
                        f"(last: {row['error']})",
                    )
                )
                if (
                    source.given_up >= PROVIDER_DOWN_FORKS
                    and not source.live_answers
                    and not source.provider_down
                ):
                    # No live call of this run has been answered (every try of those forks
                    # failed at the provider, after the upstream's own retries): it is down
                    # or throttles everything, and every fork to come would fail the same.
                    source.provider_down = True
                    source.governor.stop(
                        "the provider answered none of the job's live calls "
                        f"({source.given_up} forks given up)"
                    )
                    source.notes.append(
                        Note(
                            kind="provider_down",
                            severity="error",
                            text=f"stopped: the provider answered none of this run's live calls "
                            f"({source.given_up} forks given up after {PROVIDER_ATTEMPTS} tries "
                            f"each; last: {row['error']}): it is down or throttles every call. "
                            "Check its address and status, then run the same command again: "
                            "it resumes",
                            figures={"given_up": source.given_up},
                        )
                    )
                source.unrun(spec)
                return
            self._again(slot, row["stage"], spec, row["attempt"], worst=False)
            return
        added = source.sink.add(row)
        if added or row["task_id"] not in source.rows_by_task:
            # A row the sink refuses is one it already holds on disk (another run of this
            # job wrote it after this one read the output): it is still this fork's result,
            # and the estimators must see it once.
            source.remember(row)
            source.observe(row)
        else:  # pragma: no cover - a task is never submitted twice
            source.unrun(ForkSpec.model_validate_json(row["spec"]))
        source.received(rows=1)
