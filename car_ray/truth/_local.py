"""One attribution job in this process: the scheduler's stages, estimators and budget over a
`LocalExecutor` whose forks the simulated provider answers in process. Statistics only (no
Ray, no Parquet): for `bench`, which runs hundreds of jobs to measure accuracy per fork."""

from __future__ import annotations

from typing import Any

from ..execute import Executor, LocalExecutor, MemorySink, RowSink
from ..job import Job
from ..providers import PriceTable
from ..schedule import Budget, JobOutcome, Scheduler, job_id_of
from ..tape import Tape
from ._solver import sim_runner


def run_local(job: Job, tape: Tape, budget: Budget) -> tuple[JobOutcome, list[dict[str, Any]]]:
    """Run `job` on `tape` under `budget` in this process: its outcome and every fork row."""
    outcome, rows, _ = run_local_scheduler(job, tape, budget)
    return outcome, rows


def run_local_scheduler(
    job: Job, tape: Tape, budget: Budget
) -> tuple[JobOutcome, list[dict[str, Any]], Scheduler]:
    """`run_local`, and the scheduler that ran it (its ledger: `scheduler.governor`)."""
    executor = LocalExecutor(sim_runner(job, tape))
    sink = MemorySink()
    try:
        scheduler = local_scheduler(job, tape, budget, executor, sink)
        outcome = scheduler.run()
    finally:
        executor.shutdown()
    return outcome, sink.rows, scheduler


def local_scheduler(
    job: Job, tape: Tape, budget: Budget, executor: Executor, sink: RowSink
) -> Scheduler:
    """The scheduler of `job` on `tape` over `executor` into `sink`, at the default prices:
    `run_local`'s, or one of many jobs in one `RunLoop`."""
    return Scheduler(
        job,
        tape,
        job_id=job_id_of(job, tape),
        executor=executor,
        sink=sink,
        budget=budget,
        prices=PriceTable.load(None),
    )
