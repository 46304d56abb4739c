"""Reservations learned from settled forks: tighter than the worst case, and a fork that needs
more than its learned reservation is cut, kept, and run again at the worst case, so the
answer is the one the worst case gives and no cap is ever passed."""

from __future__ import annotations

from typing import Any

from car_ray.job import Job
from car_ray.schedule import Budget
from car_ray.tape import Tape
from car_ray.truth import run_local_scheduler


def _attribute(
    job: Job, tape: Tape, budget: Budget, learn_after: int
) -> tuple[Any, list[dict[str, Any]], Any]:
    outcome, rows, scheduler = run_local_scheduler(job, tape, budget, learn_after=learn_after)
    return outcome, rows, scheduler.governor.snapshot()


def _answer(outcome: Any) -> dict[tuple[str, int], Any]:
    return {
        (r["intervention"], r["step"]): (r["phi"], r["flip_rate"], r["rank"])
        for r in outcome.attribution
    }


def test_a_fork_cut_at_a_learned_reservation_runs_again_at_the_worst_case(
    support_job: Job, support_tape: Tape
) -> None:
    # A dollar cap (reservations are learned only under one) that does not bind: both runs
    # then ask for the same forks, and a cut fork costs only its rerun.
    budget = Budget(max_usd=1.0)
    # One fork in flight: each is reserved after the ones before it settled.
    provider = support_job.spec.provider.model_copy(update={"concurrency": 1})
    support_job = Job(support_job.path, support_job.spec.model_copy(update={"provider": provider}))
    worst, _, worst_ledger = _attribute(support_job, support_tape, budget, 10**9)
    # Learn from the first settled fork of a shape: later forks of it that make more live
    # calls are cut at their reservation.
    learned, rows, ledger = _attribute(support_job, support_tape, budget, 1)

    cut = [r for r in rows if r["task_id"].endswith("/cut")]
    assert cut, "learning from one fork must under-reserve some later fork"
    assert all(r["status"] == "budget_cut" and r["outcome"] is None for r in cut)
    done = {r["task_id"]: r for r in rows}
    for r in cut:
        again = done[r["task_id"].removesuffix("/cut")]
        assert again["status"] != "budget_cut" and again["outcome"] is not None
    # Forks are deterministic: the same forks, re-run, give the worst case's answer.
    assert _answer(learned) == _answer(worst)
    for snap in (ledger, worst_ledger):
        assert snap["spent"]["usd"] <= 1.0
    assert len({r["task_id"] for r in rows}) == len(rows)
    assert worst_ledger["reservations"]["median_ratio"] > 10
    assert ledger["reservations"]["median_ratio"] < worst_ledger["reservations"]["median_ratio"]
