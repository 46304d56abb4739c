"""The attribution job as the run loop's source of forks (`Scheduler`): verify the tape, run
its plan of stages (`_plan.plan_of`), then build its table, notes and answer from what the
stages handed back (`_table`).

The scheduler only schedules: each stage suggests forks through its `JobContext`, the job's
costs reserve each one in its ledger (`_costs.ForkCosts`), and the run loop (`_loop.RunLoop`)
hands each row back to the stage. A restarted job feeds the rows already written back into
its stages and never runs a task id twice (`_context.Seeds`)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._answer import Answer
from .._canon import digest_of
from .._notes import Note
from ..execute import Executor, Item, Row, RowSink
from ..job import Job, couples_draws
from ..providers import PriceTable
from ..replay import ForkSpec, SpendLimit
from ..tape import Tape
from ._budget import Budget, BudgetGovernor, Cost, effective_budget
from ._context import (
    JobContext,
    Rows,
    Seeds,
    ShapleyRules,
    arm_key_of,
    job_arms,
    seed_base,
)
from ._costs import ForkCosts
from ._loop import Gate, RunLoop
from ._plan import plan_of
from ._table import (
    Results,
    attribution_table,
    held_answer,
    held_notes,
    measured_answer,
)
from ._tuning import COUPLE_LOWER, COUPLE_MOST, COUPLE_SPAN, FAILED_SHARE, LEARN_AFTER
from .estimators import DecisionShares
from .rules import NarrowingWindow, SignAndT, earlier_if_blameless
from .stages import UNSCORED, Lead, Next, Stage

# A job's statuses that are a failed job: its CLI exits non-zero.
FAILED_STATUSES = frozenset({"verify_failed", "control_failed", "failed"})
# The rules a job's Shapley stage is given unless the caller gives others.
SHIPPED_RULES = ShapleyRules(
    stop=SignAndT(), window=NarrowingWindow(), answering=earlier_if_blameless
)


@dataclass
class Progress:
    """What the live display shows; updated by the scheduler as rows arrive."""

    stage: str = "verify"
    done: int = 0
    in_flight: int = 0
    resumed: int = 0
    lost: int = 0
    # Forks whose provider failed (rows with status provider_error; each was run again).
    provider_errors: int = 0
    spent: Cost = field(default_factory=Cost)
    caps: Budget = field(default_factory=Budget)
    started: float = field(default_factory=time.monotonic)
    eta_s: float | None = None


@dataclass
class JobOutcome:
    job_id: str
    status: str
    attribution: list[dict[str, Any]]
    notes: list[Note]
    progress: Progress
    # What the forks let the job claim (None: read from a job.json written before answers).
    answer: Answer | None = None


def job_id_of(job: Job, tape: Tape) -> str:
    """The same request on the same tape with the same agent, scorer and policy source is
    the same job (budget and output aside), so a restart on the same output resumes it; a
    code change is a new job. `<name>-<digest>`: the job file's readable name first."""
    identity = {
        "tape": tape.tape_id,
        "request": job.request_identity(),
        "code": job.source_digests(),
    }
    return f"{job.name}-{digest_of(identity)[:16]}"


class Scheduler:
    """One attribution job over one tape: its ledger and fork costs, its plan of stages and
    their results. A source of forks for `RunLoop`; `run()` runs it alone on its executor.
    `rules` are the Shapley stage's; `plan` builds the stages from the job (`plan_of`);
    `learn_after` settled forks of a shape make its reservations learned (`ForkCosts`)."""

    def __init__(
        self,
        job: Job,
        tape: Tape,
        *,
        job_id: str,
        executor: Executor,
        sink: RowSink,
        budget: Budget,
        prices: PriceTable,
        already: list[dict[str, Any]] | None = None,
        already_spent: Cost | None = None,
        already_elapsed_s: float = 0.0,
        carried: Cost | None = None,
        precise_only: bool = False,
        rules: ShapleyRules = SHIPPED_RULES,
        plan: Callable[[JobContext], list[Stage]] = plan_of,
        learn_after: int = LEARN_AFTER,
        on_progress: Callable[[Progress], None] | None = None,
        on_submit: Callable[[], None] | None = None,
        recorded: float | None = None,
    ) -> None:
        self.job = job
        # The tape's outcome as the job's own process scored it (None: not scored there): the
        # workers' replay must score it the same (`begin`).
        self.recorded = recorded
        self.job_id = job_id
        self.spec = job.spec
        self.tape = tape
        self.executor = executor
        self.sink = sink
        budget = effective_budget(budget, len(tape.steps) if self.spec.method == "auto" else None)
        self.budget = budget
        self.governor = BudgetGovernor(
            budget,
            already_spent=already_spent or Cost(),
            already_elapsed_s=already_elapsed_s,
            carried=carried or Cost(),
        )
        self.costs = ForkCosts(tape.steps, prices, self.governor, learn_after)
        self.progress = Progress(caps=budget)
        self.on_progress = on_progress or (lambda p: None)
        self.on_submit = on_submit or (lambda: None)
        self.notes: list[Note] = []
        self.stage_times: dict[str, dict[str, float]] = {}
        self._stage_started = time.monotonic()
        self._stage_done = 0
        self.status = "running"
        self.rows = Rows()
        self.rows_by_task = self.rows.by_task  # the run loop's view: rows already written
        # Every row's status (provider errors too): a mostly-failed job is a failed job.
        self.statuses: Counter[str] = Counter()
        # Provider failures by the fork's task id: its next attempt's row id is task/p<n>.
        self.provider_failed: Counter[str] = Counter()
        self.attempts: dict[str, int] = {}  # a fork's next attempt number (ledger key)
        self.given_up = 0  # forks given up after PROVIDER_ATTEMPTS provider failures
        self.live_answers = 0  # forks of this run whose live calls the provider answered
        self.provider_down = False  # stopped: the provider answered none of them
        self.arms = job_arms(job, tape)
        # The simulated provider couples draws: a held fork with no fresh draw is then
        # deterministic, and one fork is its exact value. Elsewhere a held step that chose
        # keeps its decision as a maximal coupling would, estimated (`DecisionShares`).
        honours_seed = couples_draws(self.spec.provider.model_dump())
        self.shares = DecisionShares(most=COUPLE_MOST, span=COUPLE_SPAN, lower=COUPLE_LOWER)
        couple: Callable[[], dict[int, tuple[float, int]]] | None = None
        if not honours_seed:
            estimated = self.spec.coupling == "estimated"
            couple = self.shares.coupling if estimated else dict
        self.seeds = Seeds(
            tape.tape_id, seed_base(self.spec.attribution_seed, tape.run_digest), couple
        )
        self.context = JobContext(
            spec=self.spec,
            tape=tape,
            arms=self.arms,
            seeds=self.seeds,
            rows=self.rows,
            rules=rules,
            forks_left=self.forks_left,
            go_on=self.governor.go_on,
            honours_seed=honours_seed,
            precise_only=precise_only,
            shares=self.shares,
        )
        self.plan = plan
        self.results = Results()
        self.stage: Stage | None = None  # the plan's current stage
        self._stages: list[Stage] = []  # the plan's stages after it
        self.outcome: JobOutcome | None = None  # once the job has finished
        for row in already or []:
            self.remember(row)
        self.progress.resumed = len(already or [])

    @property
    def seed_base(self) -> int:
        return self.seeds.base

    @property
    def candidates(self) -> list[int]:
        """The steps the Shapley whose blame the job shows is over: the running stage's,
        else (the job ended) the last result's."""
        running = self.stage is not None and self.outcome is None and self.stage.name == "shapley"
        if running and self.stage is not None:
            return list(self.stage.state().get("candidates", []))
        shapley = self.results.shapley
        return list(shapley.candidates) if shapley is not None else []

    def lead(self) -> Lead | None:
        """The leading cause so far, as the current stage sees it."""
        return self.stage.lead() if self.stage is not None else None

    def forks_left(self) -> float | None:
        """How many more forks the job's caps let it begin, beside those in flight: its fork
        cap, and its dollar and token caps at the mean cost of a fork so far (None without
        any cap, or before a fork has cost anything under a money cap alone)."""
        left, spent = self.governor.remaining(), self.governor.spent
        out: list[float] = []
        if left.forks is not None:
            out.append(float(left.forks))
        if spent.forks:
            if left.usd is not None and spent.usd > 0:
                out.append(left.usd * spent.forks / spent.usd)
            if left.tokens is not None and spent.tokens > 0:
                out.append(left.tokens * spent.forks / spent.tokens)
        return min(out, default=None)

    def estimate(self, spec: ForkSpec, *, worst: bool = False) -> Cost:
        """What a fork is reserved for (`ForkCosts.reservation`)."""
        return self.costs.estimate(spec, worst=worst)

    # -- rows ---------------------------------------------------------------------------------

    def remember(self, row: dict[str, Any]) -> None:
        """Keep a row (new or resumed) by task and arm, learn its cost, and keep the seed
        counters ahead; its stage sees it through `observe`."""
        task = row["task_id"]
        if task in self.rows.by_task:
            return
        spec = ForkSpec.model_validate_json(row["spec"])
        self.statuses[row["status"]] += 1
        self.costs.settled(row, spec)
        if task.endswith("/cut"):
            return  # cut at a learned reservation: the fork runs again at the worst case
        if row["status"] == "provider_error":
            # Not the agent's outcome: no stage sees it, and the fork is still to run.
            self.provider_failed[spec.task_id] += 1
            self.progress.provider_errors += 1
            return
        self.rows.by_task[task] = row
        if row["outcome"] is not None:
            self.shares.observe(spec, row.get("first_deviation"))
        stage = row["stage"]
        key = arm_key_of(stage, spec)
        self.seeds.saw(stage, key, spec)
        self.rows.by_arm[(stage, key)].append(row)

    def keep_attempt(self, row: dict[str, Any], suffix: str) -> ForkSpec:
        """Write a paid attempt that is not the fork's answer (a provider failure, a cut at
        a learned reservation) under its own row id, `<task>/<suffix>`: the fork's task id
        stays free for the run that answers. Counted, never scored."""
        self.progress.done += 1
        spec = ForkSpec.model_validate_json(row["spec"])
        row["task_id"] = f"{spec.task_id}/{suffix}"
        self.sink.add(row)
        self.remember(row)
        return spec

    def reserve(
        self,
        stage: str,
        spec: ForkSpec,
        attempt: int = 0,
        *,
        worst: bool = False,
        gate: Gate | None = None,
    ) -> tuple[Item, str] | None:
        """Reserve a fork's attempt in the job's ledger (`ForkCosts.reserve`), and in the run
        loop's policies (`gate`): the item to submit and its ledger key, or None if refused."""
        key = f"{spec.task_id}#{attempt}"
        got = self.costs.reserve(key, spec, worst=worst)
        if got is None:
            return None
        estimate, output, learned = got
        if gate is not None and not gate(key, estimate):
            self.governor.release(key)
            return None
        if learned:
            self.costs.mark_learned(key)
        limit = SpendLimit(
            usd=estimate.usd,
            tokens=estimate.tokens,
            default_output_tokens=output,
            tokens_per_byte=self.costs.tokens_per_byte,
        )
        return Item(spec, stage, attempt, limit, job_id=self.job_id), key

    def learned(self, key: str) -> bool:
        """Whether the attempt under ledger `key` was reserved at a learned estimate."""
        return self.costs.learned(key)

    def tick(self) -> None:
        self.progress.spent = self.governor.spent
        elapsed = time.monotonic() - self.progress.started
        caps = self.budget
        if caps.max_forks and self.progress.done:
            used = self.governor.spent.forks + self.governor.reserved.forks
            rate = self.progress.done / max(elapsed, 1e-9)
            self.progress.eta_s = max(0.0, (caps.max_forks - used) / max(rate, 1e-9))
        self.on_progress(self.progress)

    # -- stages -------------------------------------------------------------------------------

    def enter(self, name: str) -> None:
        """Enter a stage: the last one's forks and wall time go into `stage_times`."""
        now = time.monotonic()
        entry = self.stage_times.setdefault(self.progress.stage, {"forks": 0, "wall_s": 0.0})
        entry["forks"] += self.progress.done - self._stage_done
        entry["wall_s"] = round(entry["wall_s"] + now - self._stage_started, 3)
        self.progress.stage = name
        self._stage_started = now
        self._stage_done = self.progress.done

    def run(self) -> JobOutcome:
        """Run the job alone on its executor (`RunLoop` runs many at once)."""
        loop = RunLoop(self.executor)
        loop.add(self)
        loop.run()
        assert self.outcome is not None
        return self.outcome

    # -- the job as the run loop's source of forks ------------------------------------------

    @property
    def window(self) -> int:
        """Forks of this job in flight at once: its provider's concurrency."""
        return self.spec.provider.concurrency

    def begin(self) -> bool:
        """Verify the tape and enter the first stage; False if the job ended already."""
        self.progress.stage = "verify"
        self.tick()
        check = self.executor.verify(self.tape.tape_id)
        scored = check.get("recorded_outcome")
        if (
            check["ok"]
            and self.recorded is not None
            and (scored is None or not math.isclose(scored, self.recorded, abs_tol=SCORE_TOL))
        ):
            # Every fork is scored against the workers' reading of the tape: one that differs
            # from the job's would measure another failure (or none, and blame no step).
            check = {"ok": False, "divergence": _scored_apart(self.recorded, scored)}
        if not check["ok"]:
            self.status = "verify_failed"
            self.notes.append(
                Note(kind="verify_failed", severity="error", text=check["divergence"])
            )
            self.outcome = self._finish()
            return False
        self._stages = self.plan(self.context)
        self.results.planned = [stage.name for stage in self._stages]
        return self._enter_next()

    def _enter_next(self) -> bool:
        """Start the next stage of the plan; False (and the job finished) if none is left."""
        if not self._stages:
            self.status = "complete"
            self.outcome = self._finish()
            return False
        self.stage = self._stages.pop(0)
        self.enter(self.stage.name)
        self.stage.start()
        return True

    def suggest(self, room: int) -> list[tuple[str, ForkSpec]] | None:
        assert self.stage is not None
        return self.stage.suggest(room)

    def observe(self, row: Row) -> None:
        assert self.stage is not None
        self.stage.observe(row)

    def unrun(self, spec: ForkSpec) -> None:
        assert self.stage is not None
        self.stage.unrun(spec)

    def stage_ended(self, exhausted: bool) -> bool:
        """The current stage has nothing in flight and wants nothing more (or the budget
        refused it): keep what it handed back and go on as it says (`Next`). True when the
        job has finished."""
        assert self.stage is not None
        then: Next = self.stage.done(exhausted)
        self._keep(self.stage)
        end = then.end or ("budget_exhausted" if exhausted else None)
        if end is not None:
            self.status = end
            self.outcome = self._finish()
            return True
        self._stages[:0] = then.then
        return not self._enter_next()

    def _keep(self, stage: Stage) -> None:
        before = len(self.results.notes)
        self.results.add(stage.result())
        self.notes.extend(self.results.notes[before:])

    def submitted(self, forks: int) -> None:
        self.on_submit()

    def received(self, rows: int = 0, lost: int = 0) -> None:
        self.progress.done += rows
        self.progress.lost += lost

    def in_flight_now(self, forks: int) -> None:
        self.progress.in_flight = forks

    # -- the end ------------------------------------------------------------------------------

    def _finish(self) -> JobOutcome:
        results = self.results
        if results.screen is not None:  # the held screen and Shapley ran: what they found
            self.notes.extend(held_notes(self.context, results))
        # Each fork once, by its last row (a provider failure that was run again is not a
        # failed fork), and the forks given up.
        final = Counter(r["status"] for r in self.rows.by_task.values())
        final["provider_error"] += self.given_up
        total = sum(final.values())
        unscored = sum(final[s] for s in UNSCORED)
        if results.control_failed and self.status != "verify_failed":
            self.status = "control_failed"
        elif (
            (total and unscored / total > FAILED_SHARE) or self.provider_down
        ) and self.status != "verify_failed":
            counts = ", ".join(f"{final[s]} {s}" for s in sorted(UNSCORED))
            self.notes.append(
                Note(
                    kind="failed",
                    severity="error",
                    text=f"FAILED: {unscored} of {total} forks have no outcome ({counts}); the "
                    "attribution is not a sample of anything. See the rows' divergence, error "
                    "and provider_status columns",
                    figures={"unscored": unscored, "forks": total},
                )
            )
            self.status = "failed"
        if self.progress.provider_errors:
            self.notes.append(
                Note(
                    kind="provider_errors",
                    severity="warning",
                    text=f"{self.progress.provider_errors} forks failed at the provider and "
                    "were run again (status provider_error: never scored)",
                    figures={"forks": self.progress.provider_errors},
                )
            )
        self.enter("aggregate")
        self.progress.in_flight = 0  # every fork asked for has settled or been given up
        self.sink.flush()
        rows = [self._stamped(r) for r in attribution_table(self.context, results)]
        if "uniform" in results.planned:
            answer = measured_answer(self.context, rows, self.status)
        else:
            spent = self.governor.spent.forks + self.governor.carried.forks
            answer = held_answer(self.context, results, self.status, spent)
        if self.context.honours_seed:
            draws = "coupled"
        else:
            draws = results.draws.draws if results.draws is not None else "unknown"
        coupling = None if self.context.honours_seed else self.spec.coupling
        answer = answer.model_copy(update={"provider_draws": draws, "coupling": coupling})
        self.tick()
        return JobOutcome(self.job_id, self.status, rows, self.notes, self.progress, answer)

    def _stamped(self, row: dict[str, Any]) -> dict[str, Any]:
        """An attribution row as attribution.parquet holds it: with its job and the
        confidence level of its intervals, readable alone."""
        return {"job_id": self.job_id, **row, "confidence": self.spec.confidence}


# Scores the job's process and the workers' replay give the same tape are the same within
# this (a sum's last bits may depend on a process's hash seed, through a set's order).
SCORE_TOL = 1e-9


def _scored_apart(recorded: float, scored: float | None) -> str:
    """verify's reason when the workers' replay of the tape scores it otherwise than the job's
    own process did."""
    return (
        f"the workers score the replayed tape {scored}, where this process scored it "
        f"{recorded}: the scorer reads something the workers do not share (a file, an "
        "environment variable, the clock, a network service), so every fork would be scored "
        "against another outcome; make the scorer a function of the run's result and "
        "trajectory alone"
    )
