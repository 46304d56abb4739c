"""Each stage alone: built on a `JobContext` with rows made up here, driven through `start`,
`suggest`, `observe`, `done` and `result` without a scheduler or a run loop. What a stage
asks for and hands back is all a job's table is made of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from car_ray.job import Job
from car_ray.replay import ForkSpec, Probe
from car_ray.schedule import (
    SHIPPED_RULES,
    ControlResult,
    DeviationScreen,
    FlipCounts,
    JobContext,
    Rows,
    ScreenResult,
    Seeds,
    ShapleyResult,
    job_arms,
)
from car_ray.schedule._context import arm_key_of
from car_ray.schedule._tuning import SCREEN_CLEAN, SCREEN_FIRST
from car_ray.schedule.stages import (
    SHAPLEY_SEEDS,
    HeldArms,
    HeldControl,
    HeldScreen,
    HeldShapley,
    Next,
    Stage,
    Uniform,
)
from car_ray.tape import Tape

CAUSE = 4  # the refund decision of the demo's tape


def _context(job: Job, tape: Tape, **update: Any) -> JobContext:
    spec = job.spec.model_copy(update=update)
    return JobContext(
        spec=spec,
        tape=tape,
        arms=job_arms(Job(job.path, spec), tape),
        seeds=Seeds(tape.tape_id, 0),
        rows=Rows(),
        rules=SHIPPED_RULES,
        forks_left=lambda: None,
        go_on=lambda more: (f"--max-forks {more}", ""),
    )


def _row(ctx: JobContext, stage: str, spec: ForkSpec, flipped: bool, deviation: int | None) -> Any:
    """A scored fork's row as the run loop hands it over, kept in the context's rows."""
    row = {
        "task_id": spec.task_id,
        "spec": spec.model_dump_json(),
        "stage": stage,
        "status": "ok",
        "outcome": 0.0 if flipped else 1.0,
        "recorded_outcome": 1.0,
        "flipped": flipped,
        "first_deviation": deviation,
        "divergence": None,
        "error": None,
    }
    ctx.rows.by_task[spec.task_id] = row
    ctx.rows.by_arm[(stage, arm_key_of(stage, spec))].append(row)
    return row


def _drive(
    stage: Stage, ctx: JobContext, answer: Callable[[str, ForkSpec], tuple[bool, int | None]]
) -> tuple[list[tuple[str, ForkSpec]], Next]:
    """Start the stage and answer every fork it asks for with `answer`, until it is done."""
    stage.start()
    asked: list[tuple[str, ForkSpec]] = []
    for _ in range(10_000):
        got = stage.suggest(8)
        if got is None:
            return asked, stage.done(False)
        assert got, "a stage with nothing in flight must ask for forks or be done"
        asked += got
        for name, spec in got:
            stage.observe(_row(ctx, name, spec, *answer(name, spec)))
    pytest.fail("the stage never finished")


def test_the_control_forks_nothing_and_fails_only_off_the_recorded_outcome(
    support_job: Job, support_tape: Tape
) -> None:
    ctx = _context(support_job, support_tape)
    control = HeldControl(ctx)
    asked, then = _drive(control, ctx, lambda name, spec: (False, None))
    ((name, spec),) = asked
    assert name == "controls" and spec.interventions == {} and spec.tail == "held"
    assert then == Next() and control.result() == (ControlResult(failed=False),)

    ctx = _context(support_job, support_tape)
    control = HeldControl(ctx)
    _, then = _drive(control, ctx, lambda name, spec: (True, 2))
    ((result,),) = [control.result()]
    assert then == Next(end="control_failed") and isinstance(result, ControlResult)
    assert result.failed and result.notes[0].kind == "control_failed"
    assert result.notes[0].severity == "error"


def test_the_other_arms_are_one_exact_fork_each_and_hand_back_their_flips(
    support_job: Job, support_tape: Tape
) -> None:
    ctx = _context(support_job, support_tape)
    arms = HeldArms(ctx)
    asked, then = _drive(arms, ctx, lambda name, spec: (1 in spec.interventions, None))
    others = [a for a in ctx.arms if a.kind != "resample"]
    assert [dict(spec.interventions) for _, spec in asked] == [
        {a.step: a.intervention} for a in others
    ]
    (result,) = arms.result()
    assert then == Next() and isinstance(result, FlipCounts)
    assert {k: v for k, v in result.counts.items() if v[1]} == {
        "observation@1": (1, 1),
        "observation@3": (0, 1),
    }
    assert result.exact == {"observation@1", "observation@3"}


def test_the_screen_finds_the_step_that_leaves_the_tape_and_hands_over_to_shapley(
    support_job: Job, support_tape: Tape
) -> None:
    ctx = _context(support_job, support_tape)
    screen = HeldScreen(ctx)

    def leaves_at_the_cause(name: str, spec: ForkSpec) -> tuple[bool, int | None]:
        return (True, CAUSE) if CAUSE in spec.interventions else (False, None)

    asked, then = _drive(screen, ctx, leaves_at_the_cause)
    # The first pass goes one fork at a time and stops at its first find.
    assert len(asked) == 1 and set(asked[0][1].interventions) == set(ctx.resampled)
    (result,) = screen.result()
    assert isinstance(result, ScreenResult) and result.candidates == (CAUSE,)
    assert {k: result.clean[k] for k in result.clean} == {k: 1 for k in range(CAUSE)}
    ((next_stage,),) = [then.then]
    assert isinstance(next_stage, HeldShapley) and then.end is None

    # Nothing ever leaves the tape: SCREEN_FIRST clean draws a step, then a second pass.
    ctx = _context(support_job, support_tape)
    screen = HeldScreen(ctx)
    asked, then = _drive(screen, ctx, lambda name, spec: (False, None))
    assert len(asked) == SCREEN_FIRST
    ((second,),) = [then.then]
    assert isinstance(second, HeldScreen) and second.screen is screen.screen


def test_a_screen_whose_finds_never_change_the_outcome_checks_every_step_at_once(
    support_job: Job, support_tape: Tape
) -> None:
    """Step 0 leaves the tape at every re-draw (new words each time), and nothing changes
    the outcome. The screen does not hand step 0 to Shapley: it re-draws every step at
    once until so many such forks kept the outcome that the bound on how often that changes
    it (all steps' blame summed) is within the job's target, and a weak cause would have
    shown, then says no step is to blame, each step settled on those forks: SCREEN_CLEAN
    (20) at the default ±0.1 and 95% (1 - 0.05^(1/20) = 0.139), 29 at ±0.05 (0.098; 28
    give 0.101)."""
    for target, forks in ((0.1, SCREEN_CLEAN), (0.05, 29)):
        ctx = _context(support_job, support_tape, target_half_width=target)
        assert ctx.clean_enough == forks
        assert DeviationScreen.bound_after(forks, ctx.alpha) <= 2 * target
        screen = HeldScreen(ctx)
        asked, then = _drive(screen, ctx, lambda name, spec: (False, 0))
        assert len(asked) == forks
        assert all(set(spec.interventions) == set(ctx.resampled) for _, spec in asked)
        (result,) = screen.result()
        assert then == Next() and isinstance(result, ScreenResult)
        assert result.verdict == ("separated", ()) and result.candidates == ()
        assert dict(result.settled) == {k: forks for k in ctx.resampled}
        assert result.whole == forks and not result.moved

    # The third fork of every step changes the outcome: Shapley takes over from there.
    ctx = _context(support_job, support_tape)
    screen = HeldScreen(ctx)
    forks = iter(range(1, 100))
    asked, then = _drive(screen, ctx, lambda name, spec: (next(forks) == 3, 0))
    assert len(asked) == 3
    (result,) = screen.result()
    assert isinstance(result, ScreenResult) and result.moved and result.whole == 2
    assert result.candidates == (0,) and not result.settled and result.verdict is None
    ((next_stage,),) = [then.then]
    assert isinstance(next_stage, HeldShapley)


def test_shapley_over_one_found_step_separates_it_once_the_rest_are_cleared(
    support_job: Job, support_tape: Tape
) -> None:
    """Step 4 alone leaves the tape and always flips the outcome; every other step stays on
    it. The Shapley stage runs its seeds (each probing the steps not found), asks the screen
    for the clean draws its verdict needs, and hands back the separated top with phi 1."""
    ctx = _context(support_job, support_tape)
    found = DeviationScreen(ctx.resampled, clean_needed=SCREEN_FIRST)
    found.observe(ctx.resampled, CAUSE)
    stage = HeldShapley(ctx, found)

    def game(name: str, spec: ForkSpec) -> tuple[bool, int | None]:
        redrawn = {k for k, iv in spec.interventions.items() if not isinstance(iv, Probe)}
        return (True, CAUSE) if CAUSE in redrawn else (False, None)

    asked, then = _drive(stage, ctx, game)
    seeds = [spec.seed - SHAPLEY_SEEDS for name, spec in asked if name == "shapley"]
    assert seeds and seeds == sorted(seeds) and min(seeds) == 0
    (result,) = stage.result()
    assert then == Next() and isinstance(result, ShapleyResult)
    assert result.candidates == (CAUSE,) and result.verdict == ("separated", (CAUSE,))
    phi, _, _ = result.estimates[CAUSE]
    assert phi.value == 1.0 and phi.low is not None and phi.low > 0
    assert result.per_seed_phi.shape == (len(result.seeds), 1)
    assert CAUSE in result.screen.candidates


def test_the_uniform_scheme_asks_every_arm_k_times_with_one_tail(
    support_job: Job, support_tape: Tape
) -> None:
    ctx = _context(support_job, support_tape, method="uniform", forks_per_step=3)
    uniform = Uniform(ctx)
    asked, then = _drive(uniform, ctx, lambda name, spec: (CAUSE in spec.interventions, None))
    assert len(asked) == 3 * len(ctx.arms)
    assert {spec.tail for _, spec in asked} == {ctx.spec.uniform_tail}
    (result,) = uniform.result()
    assert then == Next() and isinstance(result, FlipCounts)
    assert result.counts[f"resample@{CAUSE}"] == (3, 3) and result.counts["resample@0"] == (0, 3)


def test_every_tuned_constant_has_its_evidence() -> None:
    """The tuning record holds every constant the scheduler chose, each with what it
    controls, what chose it, the commit and the figure."""
    from car_ray.schedule import _tuning

    names = {n for n in vars(_tuning) if n.isupper() and not n.startswith("_")} - {"RECORD"}
    assert names == set(_tuning.RECORD)
    for name, evidence in _tuning.RECORD.items():
        assert all((evidence.controls, evidence.chosen_by, evidence.commit, evidence.figure)), name
