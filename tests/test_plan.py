"""The scheduler's bookkeeping, without Ray: arms, seeds, reservations, candidates, rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from car_ray.execute import Item
from car_ray.job import InterventionEntry, Job, JobFileError, load_job
from car_ray.providers import PriceTable
from car_ray.replay import ForkSpec, Resample, SwapPolicy
from car_ray.schedule import DEFAULT_MAX_FORKS, Budget, JobContext, Scheduler, effective_budget
from car_ray.schedule.stages import SHAPLEY_SEEDS, BaseStage, Stage
from car_ray.tape import Tape

from .conftest import SUPPORT_JOB


def _scheduler(
    tape: Tape,
    entries: list[InterventionEntry] | None = None,
    plan: Callable[[JobContext], list[Stage]] | None = None,
    prices: PriceTable | None = None,
) -> Scheduler:
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
        prices=prices or PriceTable(),
        **({"plan": plan} if plan is not None else {}),
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
    fork = s.context.seeds.fork
    screened = [fork("screen", "block", {4: Resample()}, "held") for _ in range(4)]
    # A screen fork counts on from the last: the j-th is always seed j, never a row again.
    assert [f.seed - s.seed_base for f in screened] == [0, 1, 2, 3]
    control = fork("controls", "held", {}, "held", 0)
    shapley = fork("shapley", (4,), {4: Resample()}, "held", SHAPLEY_SEEDS)
    (observation, *_) = [a for a in s.arms if a.kind == "observation"]
    plan = {observation.step: observation.intervention}
    arm = fork("arms", observation.key, plan, "held", 0)
    tasks = [f.task_id for f in [*screened, control, shapley, arm]]
    assert len(set(tasks)) == len(tasks)


def test_a_policy_swap_is_reserved_at_the_new_models_price(support_tape: Tape) -> None:
    s = _scheduler(support_tape, prices=PriceTable.load())
    recorded = s.estimate(ForkSpec(tape_id=support_tape.tape_id, interventions={2: Resample()}))
    pricier = s.estimate(
        ForkSpec(tape_id=support_tape.tape_id, interventions={2: SwapPolicy(model="gpt-4o")})
    )
    # configs/pricing.toml: gpt-4o costs 16.7x gpt-4o-mini a token, in and out alike; the
    # renamed body is 5 bytes shorter, so slightly fewer input tokens are assumed.
    assert pricier.usd == pytest.approx(recorded.usd * 2.50 / 0.15, rel=0.01)
    assert pricier.forks == recorded.forks == 1
    # A later swap that names no model hands the calls back to the agent's own model.
    back = s.estimate(
        ForkSpec(
            tape_id=support_tape.tape_id,
            interventions={
                2: SwapPolicy(model="gpt-4o"),
                4: SwapPolicy(base_url="http://127.0.0.1:1/v1"),
            },
        )
    )
    assert recorded.usd < back.usd < pricier.usd
    # A fork with nothing live on the tape after its first intervention (here: none at all)
    # still has room for one call, as large as the tape's largest.
    assert s.estimate(ForkSpec(tape_id=support_tape.tape_id, interventions={})).usd > 0


def test_a_job_with_no_caps_runs_and_says_it_runs_under_the_default_fork_cap() -> None:
    assert effective_budget(Budget()) == Budget(max_forks=DEFAULT_MAX_FORKS)
    assert effective_budget(Budget(max_wall_s=5)) == Budget(
        max_forks=DEFAULT_MAX_FORKS, max_wall_s=5
    )
    assert effective_budget(Budget(max_usd=0.5)) == Budget(max_usd=0.5)


class _OneShotExecutor:
    """Runs nothing: each submitted fork comes straight back as a made-up ok row."""

    def __init__(self) -> None:
        self.pending: list[Item] = []

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def submit(self, items: list[Item]) -> None:
        self.pending += items

    def verify(self, tape_id: str) -> dict[str, Any]:
        return {"ok": True, "recorded_outcome": 1.0}

    def wait(self, timeout_s: float = 0.5) -> list[list[dict[str, Any]]]:
        rows = [
            {
                "task_id": i.spec.task_id,
                "spec": i.spec.model_dump_json(),
                "stage": i.stage,
                "cost_usd": 0.0,
                "tokens_in": 0,
                "tokens_out": 0,
                "outcome": 1.0,
                "recorded_outcome": 1.0,
                "flipped": False,
                "status": "ok",
            }
            for i in self.pending
        ]
        self.pending = []
        return [rows]


class _Sink:
    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> bool:
        if row["task_id"] in self.refuse:
            return False
        self.rows.append(row)
        return True

    def maybe_flush(self) -> None:
        pass

    def flush(self) -> None:
        pass


class _Given(BaseStage):
    """A stage that asks for `specs` once and records what it is told."""

    name = "screen"

    def __init__(self, ctx: JobContext, specs: list[ForkSpec]) -> None:
        super().__init__(ctx)
        self.given = iter([[("screen", spec) for spec in specs]])
        self.rows: list[str] = []
        self.unrun_ids: list[str] = []

    def suggest(self, room: int) -> list[tuple[str, ForkSpec]] | None:
        return next(self.given, None)

    def observe(self, row: dict[str, Any]) -> None:
        self.rows.append(row["task_id"])

    def unrun(self, spec: ForkSpec) -> None:
        self.unrun_ids.append(spec.task_id)


def test_a_row_the_sink_already_holds_still_reaches_the_estimators_once(
    support_tape: Tape,
) -> None:
    stages: list[_Given] = []

    def plan(ctx: JobContext) -> list[Stage]:
        specs = [ctx.seeds.fork("screen", "block", {4: Resample()}, "held", j) for j in range(3)]
        stages.append(_Given(ctx, specs))
        return [stages[0]]

    s = _scheduler(support_tape, plan=plan)
    s.executor = _OneShotExecutor()
    specs = [s.context.seeds.fork("screen", "block", {4: Resample()}, "held", j) for j in range(3)]
    # As if another run of the job wrote this fork's row after this one read the output.
    s.sink = _Sink(refuse={specs[1].task_id})
    outcome = s.run()
    assert outcome.status == "complete"
    (stage,) = stages
    assert stage.rows == [spec.task_id for spec in specs] and stage.unrun_ids == []
    assert len(s.rows.arm("screen", "block")) == 3
    assert s.governor.spent.forks == 3 and s.governor.reserved.forks == 0


def test_steps_with_equal_blame_are_ranked_by_how_often_re_drawing_them_alone_clears_it() -> None:
    from car_ray.schedule._table import _rank

    def row(step: int, phi: float, necessity: float) -> dict[str, Any]:
        return {"intervention": "resample", "step": step, "phi": phi, "flip_rate": necessity}

    # Two steps the seeds could not tell apart by phi (0.03 each): the one whose re-draw
    # alone cleared the failure more often comes first, not the earlier step.
    rows = [row(2, 0.03, 0.03), row(4, 0.03, 0.06), row(6, 0.01, 0.5)]
    _rank(rows, "phi")
    assert [(r["step"], r["rank"]) for r in rows] == [(2, 2), (4, 1), (6, 3)]
    # Equal in both (one seed in which nothing flipped): the forks cannot order them, so
    # they share the rank, and the next step is ranked past them, not by step number.
    rows = [row(6, -0.1, 0.0), row(4, 0.0, 0.0), row(2, 0.0, 0.0)]
    _rank(rows, "phi")
    assert [(r["step"], r["rank"]) for r in rows] == [(6, 3), (4, 1), (2, 1)]


def test_a_job_file_naming_a_removed_method_says_what_to_use(tmp_path: Path) -> None:
    text = SUPPORT_JOB.read_text().replace('method = "auto"', 'method = "flip"')
    (tmp_path / "job.toml").write_text(text)
    with pytest.raises(JobFileError, match=r"job.toml: key 'method': .*'flip' was removed"):
        load_job(tmp_path / "job.toml")
