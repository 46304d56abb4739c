"""The scheduler's bookkeeping, without Ray: arms from the job file and seeds per stage."""

from __future__ import annotations

import pytest

from car_ray.job import InterventionEntry, Job, load_job
from car_ray.providers import PriceTable
from car_ray.replay import Resample
from car_ray.schedule import Budget, Scheduler
from car_ray.tape import Tape

from .conftest import SUPPORT_JOB


def _scheduler(tape: Tape, entries: list[InterventionEntry] | None = None) -> Scheduler:
    job = load_job(SUPPORT_JOB)
    if entries is not None:
        job = Job(job.path, job.spec.model_copy(update={"interventions": entries}))
    return Scheduler(
        job,
        tape,
        job_id="t",
        executor=None,
        sink=None,
        budget=Budget(max_forks=10),
        prices=PriceTable(),
    )


def test_an_intervention_that_misfits_its_step_is_refused_before_any_fork(
    support_tape: Tape,
) -> None:
    wrong = InterventionEntry.model_validate({"kind": "observation", "steps": [0], "result": 1})
    with pytest.raises(ValueError, match=r"job.toml: interventions: 'observation' at step 0"):
        _scheduler(support_tape, [wrong])
    twice = InterventionEntry.model_validate({"kind": "observation", "steps": [1, 1], "result": 1})
    with pytest.raises(ValueError, match="at step 1 is given twice"):
        _scheduler(support_tape, [twice])


def test_no_two_stages_make_the_same_task(support_tape: Tape) -> None:
    s = _scheduler(support_tape)
    screened = [s._spec("screen", "resample@4", {4: Resample()}, "live", j) for j in range(4)]
    raced = s._spec("race", "resample@4", {4: Resample()}, "live")
    # The race goes on from the screen's seeds: a race fork is never a screen row again.
    assert raced.seed == 4
    assert raced.task_id not in {f.task_id for f in screened}
    control = s._spec("controls", "pinned", {}, "pinned", 0)
    empty = s._spec("shapley", "", {}, "pinned")
    # The pinned-everything control is the empty coalition: they share one counter.
    assert empty.seed == 1 and empty.task_id != control.task_id
