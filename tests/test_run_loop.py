"""One run loop, many jobs: two scenarios' jobs share one executor at once, each keeps its own
stages, sink and ledger, and gets what it gets alone; a shared budget stops them both."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from car_ray._scenario import ensure_tape
from car_ray.execute import BatchLost, LocalExecutor, MemorySink
from car_ray.job import Job, load_job
from car_ray.schedule import (
    Budget,
    Deadline,
    RunLoop,
    Scheduler,
    SharedBudget,
    Window,
    job_id_of,
)
from car_ray.tape import Tape
from car_ray.truth import local_scheduler, run_local, sim_runner

from .conftest import ROOT

SCENARIOS = ("and_conj", "echo")


class _Watched(LocalExecutor):
    """A LocalExecutor that notes, at each wait, the jobs of the forks it is about to run."""

    def __init__(self, jobs: list[tuple[Job, Tape]]) -> None:
        first, *rest = jobs
        super().__init__(sim_runner(*first))
        for job, tape in rest:
            self.add_job(job_id_of(job, tape), sim_runner(job, tape))
        self.running: list[list[str]] = []  # the job of every fork, per wait

    def wait(self, timeout_s: float = 0.5) -> Iterable[list[dict[str, Any]] | BatchLost]:
        self.running.append([item.job_id for item in self._pending])
        return super().wait(timeout_s)


def _jobs(tmp_path: Path) -> list[tuple[Job, Tape]]:
    out = []
    for name in SCENARIOS:
        job = load_job(ROOT / "jobs" / name / "job.toml")
        job = Job(job.path, job.spec.model_copy(update={"tape": str(tmp_path / f"{name}.tape")}))
        out.append((job, ensure_tape(job)))
    return out


def _together(
    jobs: list[tuple[Job, Tape]], policies: list[Any]
) -> tuple[list[Scheduler], list[MemorySink], _Watched]:
    executor = _Watched(jobs)
    loop = RunLoop(executor, policies)
    schedulers, sinks = [], []
    for job, tape in jobs:
        sink = MemorySink()
        scheduler = local_scheduler(job, tape, Budget(), executor, sink)
        loop.add(scheduler)
        schedulers.append(scheduler)
        sinks.append(sink)
    try:
        loop.run()
    finally:
        executor.shutdown()
    return schedulers, sinks, executor


def test_two_jobs_in_one_loop_get_what_each_gets_alone(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    alone = [run_local(job, tape, Budget()) for job, tape in jobs]
    schedulers, sinks, executor = _together(jobs, [])
    ids = [s.job_id for s in schedulers]
    # Forks of both jobs ran in the same batches, not one job after the other.
    both = [run for run in executor.running if set(run) == set(ids)]
    assert len(both) >= 3, executor.running
    for scheduler, sink, (outcome, rows) in zip(schedulers, sinks, alone, strict=True):
        assert scheduler.outcome is not None
        assert scheduler.outcome.status == outcome.status
        # Same seeds, same forks, in the same order, with the same results.
        assert [r["task_id"] for r in sink.rows] == [r["task_id"] for r in rows]
        assert [r["outcome"] for r in sink.rows] == [r["outcome"] for r in rows]
        assert {r["job_id"] for r in sink.rows} == {scheduler.job_id}
        assert scheduler.outcome.attribution == outcome.attribution
        assert scheduler.outcome.notes == outcome.notes


def test_a_shared_budget_stops_both_jobs_at_its_cap(tmp_path: Path) -> None:
    jobs = _jobs(tmp_path)
    shared = SharedBudget(Budget(max_forks=24))
    schedulers, sinks, executor = _together(jobs, [shared, Window(6)])
    rows = [r for sink in sinks for r in sink.rows]
    assert len(rows) <= 24
    assert shared.governor.spent.forks == len(rows) and shared.governor.in_flight == 0
    for scheduler, sink in zip(schedulers, sinks, strict=True):
        assert scheduler.outcome is not None
        assert scheduler.outcome.status == "budget_exhausted"
        assert sink.rows, "each job had its share of the cap"
        assert scheduler.governor.spent.forks == len(sink.rows)
    # The shared window held: never more than 6 forks at once, of both jobs together.
    assert max(len(run) for run in executor.running) <= 6
    assert any(len(set(run)) == 2 for run in executor.running)


def test_past_the_deadline_no_fork_starts_and_both_jobs_end(tmp_path: Path) -> None:
    # A clock that ticks once each time it is read: the deadline admits four forks.
    ticks = itertools.count()
    schedulers, sinks, _ = _together(_jobs(tmp_path), [Deadline(5, clock=lambda: next(ticks))])
    assert sum(len(sink.rows) for sink in sinks) == 4
    for scheduler in schedulers:
        assert scheduler.outcome is not None
        assert scheduler.outcome.status == "budget_exhausted"
        assert scheduler.governor.in_flight == 0
