"""One attribution job in this process: the scheduler's stages, estimators and budget over a
`LocalExecutor` whose forks the simulated provider answers in process. Statistics only (no
Ray, no Parquet): for `bench`, which runs hundreds of jobs to measure accuracy per fork."""

from __future__ import annotations

from typing import Any

from ..execute import Executor, LocalExecutor, MemorySink, RowSink
from ..job import Job
from ..providers import PriceTable
from ..schedule import (
    SHIPPED_RULES,
    Budget,
    Cost,
    JobOutcome,
    Scheduler,
    ShapleyRules,
    job_id_of,
)
from ..schedule._tuning import LEARN_AFTER
from ..tape import Tape
from ._solver import sim_runner


def run_local(
    job: Job, tape: Tape, budget: Budget, rules: ShapleyRules = SHIPPED_RULES
) -> tuple[JobOutcome, list[dict[str, Any]]]:
    """Run `job` on `tape` under `budget` in this process: its outcome and every fork row."""
    outcome, rows, _ = run_local_scheduler(job, tape, budget, rules=rules)
    return outcome, rows


def run_local_scheduler(
    job: Job,
    tape: Tape,
    budget: Budget,
    already: list[dict[str, Any]] | None = None,
    rules: ShapleyRules = SHIPPED_RULES,
    learn_after: int = LEARN_AFTER,
) -> tuple[JobOutcome, list[dict[str, Any]], Scheduler]:
    """`run_local`, and the scheduler that ran it (its ledger: `scheduler.governor`; what its
    stages handed back: `scheduler.results`). With `already` (the rows of an earlier run of
    the job), the run goes on from them as a rerun of `car-ray attribute` does: their cost
    counts against the caps, and the rows returned are the new ones. `rules`: the Shapley
    stage's (a benchmark compares rules by passing them); `learn_after`: settled forks of a
    shape before its reservation is learned."""
    executor = LocalExecutor(sim_runner(job, tape))
    sink = MemorySink()
    try:
        scheduler = local_scheduler(
            job, tape, budget, executor, sink, already, rules, learn_after=learn_after
        )
        outcome = scheduler.run()
    finally:
        executor.shutdown()
    return outcome, sink.rows, scheduler


def local_scheduler(
    job: Job,
    tape: Tape,
    budget: Budget,
    executor: Executor,
    sink: RowSink,
    already: list[dict[str, Any]] | None = None,
    rules: ShapleyRules = SHIPPED_RULES,
    learn_after: int = LEARN_AFTER,
) -> Scheduler:
    """The scheduler of `job` on `tape` over `executor` into `sink`, at the default prices:
    `run_local`'s, or one of many jobs in one `RunLoop`; going on from `already`, if given."""
    rows = already or []
    return Scheduler(
        job,
        tape,
        job_id=job_id_of(job, tape),
        executor=executor,
        sink=sink,
        budget=budget,
        prices=PriceTable.load(None),
        already=rows,
        already_spent=Cost(
            len(rows),
            sum(r["cost_usd"] for r in rows),
            sum(r["tokens_in"] + r["tokens_out"] for r in rows),
        ),
        rules=rules,
        learn_after=learn_after,
    )
