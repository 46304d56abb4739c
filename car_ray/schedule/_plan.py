"""The attribution job: verify, then its plan of stages (`Scheduler.plan`), then aggregate.

The job is a source of forks for the run loop (`_loop.RunLoop`): its current stage suggests
them, its ledger reserves each one, and the loop hands each row back to the stage, the sink
and the estimators as it arrives. A restarted
job feeds the rows already written back into the estimators and never runs a task id twice:
seeds are counted per arm (see `_counter`), so the j-th fork of an arm is always the same task."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .._answer import Answer
from .._canon import canonical_bytes, digest_of, sha256_hex
from ..execute import Executor, Item, Row, RowSink
from ..job import Job
from ..providers import PriceTable
from ..replay import ForkSpec, Intervention, SpendLimit, SwapPolicy, Tail, call_bound
from ..tape import LlmEvent, Tape, ToolEvent
from ._budget import Budget, BudgetGovernor, Cost
from ._estimators import wilson
from ._loop import Gate, RunLoop
from ._mechanism import DeviationScreen, Interval, SeedShapley
from ._stages import (
    UNSCORED,
    HeldArms,
    HeldControl,
    HeldScreen,
    Next,
    Stage,
    Uniform,
    arm_key_of,
    held_answer,
    held_notes,
    measured_answer,
)

OUTPUT_FLOOR_TOKENS = 256
LEARNED_OUTPUT_FLOOR = 32
DEFAULT_MAX_FORKS = 2000  # when a job sets no cap at all and its tape is not known
DEFAULT_FORKS_PER_STEP = 10  # the auto method's cap when a job sets none: 10 forks a step
TAIL_SLACK = 2  # a live tail may make this many times the recorded calls before it is cut
# A job's statuses that are a failed job: its CLI exits non-zero.
FAILED_STATUSES = frozenset({"verify_failed", "control_failed", "failed"})
# A fork's reservation is learned from settled forks of its shape (`Scheduler._shapes`) once
# there are this many: their most live calls, each at a call bound with a learned output.
# A fork that needs more is cut and run once more at the worst case.
LEARN_AFTER = 4
# A job whose forks mostly end unscored (divergence, error, provider_error) has failed: its
# few scored forks are not a sample of anything.
FAILED_SHARE = 0.5


def seed_base(attribution_seed: int, run_digest: str) -> int:
    """The first fork seed of an attribution: a hash of its seed and the run the tape holds
    (`Tape.run_digest`), shifted so that a job's 2^32 fork seeds never reach another's. The
    same run and seed draw the same forks (a resume, a rerun, the same scenario recorded
    again on another machine); another run with the same seed draws independently, so the
    traces of a batch (one job file, one seed) are independent trials, not one draw
    sequence whose bad luck every trace shares. Below 2^63: a seed fits a signed 64-bit
    column and a provider's integer seed."""
    digest = sha256_hex(f"car-ray/attribution/{attribution_seed}/{run_digest}".encode())
    return (int(digest[:8], 16) >> 1) << 32


@dataclass(frozen=True)
class Arm:
    """One thing whose flip-rate the job measures: an intervention kind at a step."""

    kind: str
    step: int
    intervention: Intervention

    @property
    def key(self) -> str:
        return f"{self.kind}@{self.step}"


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
    leader: str = ""
    started: float = field(default_factory=time.monotonic)
    eta_s: float | None = None


@dataclass
class JobOutcome:
    job_id: str
    status: str
    attribution: list[dict[str, Any]]
    notes: list[str]
    progress: Progress
    # What the forks let the job claim (None: read from a job.json written before answers).
    answer: Answer | None = None


def job_arms(job: Job, tape: Tape) -> list[Arm]:
    """The arms a job measures on a tape: each `[[interventions]]` entry at each of its steps
    (every step for a resample without steps), checked against the step's kind."""
    steps = tape.steps
    arms: list[Arm] = []
    for entry in job.spec.interventions:
        for k in entry.steps if entry.steps is not None else range(len(steps)):
            if k >= len(steps):
                raise ValueError(
                    f"{job.path}: interventions: step {k} does not exist "
                    f"(the tape has steps 0..{len(steps) - 1})"
                )
            event = steps[k]
            if entry.kind == "observation" and not isinstance(event, ToolEvent):
                raise ValueError(
                    f"{job.path}: interventions: 'observation' at step {k}, which is "
                    "a model call; observation replaces a tool step's result"
                )
            if entry.kind in ("action", "context") and not isinstance(event, LlmEvent):
                raise ValueError(
                    f"{job.path}: interventions: '{entry.kind}' at step {k}, which is "
                    f"tool {event.name!r}; it needs a model-call step"
                )
            arm = Arm(entry.kind, k, entry.intervention())
            if any(a.key == arm.key for a in arms):
                raise ValueError(
                    f"{job.path}: interventions: '{entry.kind}' at step {k} is given "
                    "twice; give each kind one value a step"
                )
            arms.append(arm)
    return arms


def effective_budget(budget: Budget, steps: int | None = None) -> Budget:
    """The caps a job runs under: a job that sets none gets DEFAULT_FORKS_PER_STEP forks a
    step of its tape (DEFAULT_MAX_FORKS when the tape is not known): a job never runs
    unbounded."""
    if all(v is None for v in (budget.max_forks, budget.max_usd, budget.max_tokens)):
        return Budget(
            max_forks=DEFAULT_MAX_FORKS
            if steps is None
            else min(DEFAULT_MAX_FORKS, DEFAULT_FORKS_PER_STEP * max(1, steps)),
            max_usd=budget.max_usd,
            max_tokens=budget.max_tokens,
            max_wall_s=budget.max_wall_s,
        )
    return budget


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
    """One attribution job over one tape: its plan of stages, its ledger and reservations,
    its rows and the table aggregated from them. A source of forks for `RunLoop`; `run()`
    runs it alone on its executor."""

    # `--more`: a separated top cause does not end the Shapley stage; only intervals within
    # the target do (`_may_stop`).
    precise_only: bool = False

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
        candidates: list[int] | None = None,
        on_progress: Callable[[Progress], None] | None = None,
        on_submit: Callable[[], None] | None = None,
    ) -> None:
        self.job = job
        self.job_id = job_id
        self.spec = job.spec
        self.tape = tape
        self.executor = executor
        self.sink = sink
        self.prices = prices
        self.alpha = 1 - self.spec.confidence
        budget = effective_budget(budget, len(tape.steps) if self.spec.method == "auto" else None)
        self.budget = budget
        self.governor = BudgetGovernor(
            budget,
            already_spent=already_spent or Cost(),
            already_elapsed_s=already_elapsed_s,
            carried=carried or Cost(),
        )
        self.progress = Progress(caps=budget)
        self.on_progress = on_progress or (lambda p: None)
        self.on_submit = on_submit or (lambda: None)
        self.notes: list[str] = []
        self.stage_times: dict[str, dict[str, float]] = {}
        self._stage_started = time.monotonic()
        self._stage_done = 0
        self.status = "running"
        self.steps = tape.steps
        self.rows_by_arm: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        self.rows_by_task: dict[str, dict[str, Any]] = {}
        # Every row's status (provider errors too): a mostly-failed job is a failed job.
        self.statuses: Counter[str] = Counter()
        # Provider failures by the fork's task id: its next attempt's row id is task/p<n>.
        self.provider_failed: Counter[str] = Counter()
        self.control_failed = False
        self.attempts: dict[str, int] = {}  # a fork's next attempt number (ledger key)
        self.given_up = 0  # forks given up after PROVIDER_ATTEMPTS provider failures
        # Live calls of settled forks by shape (tail, first intervened step): what a fork of
        # that shape is reserved for once LEARN_AFTER have settled.
        self.calls_by_shape: dict[tuple[str, Any], list[int]] = defaultdict(list)
        self._learned: set[str] = set()  # ledger keys reserved at a learned estimate
        self.output_per_call: list[int] = []  # output tokens per live call of settled forks
        self.cut_tasks: set[str] = set()  # forks cut at a learned reservation: worst case now
        self.seed_next: dict[tuple[str, str], int] = defaultdict(int)
        self.arms = job_arms(job, tape)
        # Every fork seed derives from the attribution's seed and the tape: the j-th fork of
        # a counter has seed base + j, and fresh draws hash (seed, step).
        self.seed_base = seed_base(self.spec.attribution_seed, self.tape.run_digest)
        # The simulated provider honours seeds: a held fork with no fresh draw is then
        # deterministic, and one fork is its exact value.
        self.honours_seed = self.spec.provider.base_url is None
        self.screen: DeviationScreen | None = None
        self.seed_shapley: SeedShapley | None = None
        self.verdict: tuple[str, list[int]] | None = None
        # Why the budget ended before a verdict, and what would give one (`HeldShapley`).
        self.unsettled: str | None = None
        # The steps not found that lack the clean draws the top would need, and the draws
        # each needs (`HeldShapley._unsettled`), once the budget ended before a verdict.
        self.lacking: dict[int, float] | None = None
        # Shapley's candidate steps, once chosen (a resumed job passes its first run's choice
        # from job.json: its flip-rates, and so its choice, may differ now).
        self.candidates: list[int] = sorted(candidates or [])
        self.stage: Stage | None = None  # the plan's current stage
        self._stages: list[Stage] = []  # the plan's stages after it
        self.outcome: JobOutcome | None = None  # once the job has finished
        for row in already or []:
            self.remember(row)
        self.progress.resumed = len(already or [])

    # -- arms and specs --------------------------------------------------------------------

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

    def _spec(
        self,
        stage: str,
        arm_key: str,
        plan: dict[int, Intervention],
        tail: Tail,
        seed: int | None = None,
    ) -> ForkSpec:
        """The next fork of an arm. Fixed stages pass `seed` (the j-th fork is always seed j,
        so a resumed job finds it written); adaptive stages count on from the last seed."""
        counter = _counter(stage, arm_key)
        if seed is None:
            seed = self.seed_next[counter]
        self.seed_next[counter] = max(self.seed_next[counter], seed + 1)
        return ForkSpec(
            tape_id=self.tape.tape_id, interventions=plan, tail=tail, seed=self.seed_base + seed
        )

    def _shapes(self, spec: ForkSpec) -> tuple[tuple[str, Any], ...]:
        """A fork's shapes, finest first: its tail and intervened steps (the forks of a
        Shapley coalition across seeds), its tail and first intervened step, and its tail
        alone (the most live calls any fork of that tail made: Shapley chains and screen
        blocks come in many shapes, few of which settle four forks under a tight cap)."""
        first = min(spec.interventions, default=len(self.steps))
        steps = tuple(sorted(spec.interventions))
        return (spec.tail, steps), (spec.tail, first), (spec.tail, None)

    def _seen_calls(self, spec: ForkSpec) -> list[int]:
        """Live calls of settled forks of the finest shape with LEARN_AFTER of them."""
        for shape in self._shapes(spec):
            seen = self.calls_by_shape.get(shape, [])
            if len(seen) >= LEARN_AFTER:
                return seen
        return []

    def estimate(self, spec: ForkSpec, *, worst: bool = False) -> Cost:
        """What a fork is reserved for (see `reservation`)."""
        return self.reservation(spec, worst=worst)[0]

    def reservation(self, spec: ForkSpec, *, worst: bool = False) -> tuple[Cost, int, bool]:
        """A fork's reservation, the output tokens a call without max_tokens is assumed to
        stay under (its SpendLimit must use the same), and whether it was learned.

        The worst case: every recorded model call from the first intervention on, TAIL_SLACK
        times, plus one, each at the largest call's bound. Learned, once LEARN_AFTER forks of
        its shape (`_shapes`) have settled under a dollar or token cap: their most live
        calls, each at the bound with a learned output (`output_bound`). A fork that needs
        more is cut at its reservation, never overspent, and runs again at the worst case."""
        seen = self._seen_calls(spec)
        worst_calls = self._tail_calls(spec)
        # Only a dollar or token cap is served by a tighter reservation; without one, a
        # learned reservation would only cut forks.
        money = self.budget.max_usd is not None or self.budget.max_tokens is not None
        learned = money and not worst and len(seen) >= LEARN_AFTER and max(seen) < worst_calls
        output = self.output_bound(learned=learned)
        bound = self._call_bound(spec, output)
        calls = max(seen) if learned else worst_calls
        return Cost(forks=1, usd=bound.usd * calls, tokens=bound.tokens * calls), output, learned

    def _tail_calls(self, spec: ForkSpec) -> int:
        first = min(spec.interventions, default=len(self.steps))
        # Pinned tails too: a pin is lost (and the call goes live) when the run's shape
        # leaves the tape's, so every later model call may be live.
        live = [e for e in self.steps if isinstance(e, LlmEvent) and e.step >= first]
        return len(live) * TAIL_SLACK + 1

    def _call_bound(self, spec: ForkSpec, output: int) -> Cost:
        """The largest live call a fork may make (tokens, usd): the recorded requests it may
        resend, at the model a policy swap puts in their place."""
        first = min(spec.interventions, default=len(self.steps))
        live = [e for e in self.steps if isinstance(e, LlmEvent) and e.step >= first]
        # Room for one call beyond the tape's, sized like its largest: also after a trailing
        # tool step, whose live tail may still call a model.
        sized = live or [e for e in self.steps if isinstance(e, LlmEvent)]
        # A policy swap holds from its step until the next swap: its model, at its price.
        swaps = sorted(
            (k, iv) for k, iv in spec.interventions.items() if isinstance(iv, SwapPolicy)
        )
        usd = tokens = 0.0
        for event in sized:
            body, model = event.request.body, event.model
            active = [iv for k, iv in swaps if k <= max(event.step, first)]
            if active and active[-1].model is not None:
                model = active[-1].model
                body = {**body, "model": model} if isinstance(body, dict) else body
            t, u = call_bound(body, self.prices, model, output, self.tokens_per_byte)
            usd, tokens = max(usd, u), max(tokens, t)
        return Cost(forks=1, usd=usd, tokens=int(tokens))

    def output_bound(self, *, learned: bool = False) -> int:
        """Output tokens assumed for a call that sets no max_tokens: four times the most the
        tape's model calls produced, at least OUTPUT_FLOOR_TOKENS; learned (once LEARN_AFTER
        forks made live calls), twice the most of the tape's calls and of the forks' output
        per call, at least LEARNED_OUTPUT_FLOOR."""
        recorded = [e.usage.get("output_tokens", 0) for e in self.steps if isinstance(e, LlmEvent)]
        most = max(recorded, default=0)
        if learned and len(self.output_per_call) >= LEARN_AFTER:
            most = max(most, *self.output_per_call)
            return max(LEARNED_OUTPUT_FLOOR, 2 * most)
        return max(OUTPUT_FLOOR_TOKENS, 4 * most)

    @cached_property
    def tokens_per_byte(self) -> float:
        """Input tokens per byte of canonical request JSON: the most the tape's own calls
        had (their provider's tokenizer), a quarter more for safety; 1/3 without usage."""
        ratios = [
            e.usage.get("input_tokens", 0) / len(canonical_bytes(e.request.body))
            for e in self.steps
            if isinstance(e, LlmEvent) and e.request.body is not None
        ]
        ratios = [r for r in ratios if r > 0]
        return min(1.0, 1.25 * max(ratios)) if ratios else 1 / 3

    # -- rows ------------------------------------------------------------------------------

    def remember(self, row: dict[str, Any]) -> None:
        """Feed a row (new or resumed) to the estimators; keep the seed counters ahead."""
        task = row["task_id"]
        if task in self.rows_by_task:
            return
        spec = ForkSpec.model_validate_json(row["spec"])
        self.statuses[row["status"]] += 1
        calls = row.get("tail_calls", 0)
        if row["status"] not in ("budget_cut", "provider_error", "error"):
            for shape in self._shapes(spec):
                self.calls_by_shape[shape].append(calls)
            if calls:
                self.output_per_call.append(-(-row.get("tokens_out", 0) // calls))
        if task.endswith("/cut"):
            # Cut at a learned reservation: the fork runs again at the worst case.
            self.cut_tasks.add(spec.task_id)
            return
        if row["status"] == "provider_error":
            # Not the agent's outcome: no estimator sees it, and the fork is still to run.
            self.provider_failed[spec.task_id] += 1
            self.progress.provider_errors += 1
            return
        self.rows_by_task[task] = row
        stage = row["stage"]
        key = arm_key_of(stage, spec)
        counter = _counter(stage, key)
        self.seed_next[counter] = max(self.seed_next[counter], spec.seed - self.seed_base + 1)
        self.rows_by_arm[(stage, key)].append(row)

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
        """Reserve a fork's attempt in the job's ledger (`reservation`), and in the run
        loop's policies (`gate`): the item to submit and its ledger key, or None if refused."""
        worst = worst or spec.task_id in self.cut_tasks
        estimate, output, learned = self.reservation(spec, worst=worst)
        key = f"{spec.task_id}#{attempt}"
        if not self.governor.try_reserve(key, estimate):
            # At a cap's edge, alone: the fork may have what is left if that holds at least
            # one call (it is cut, never overspent, if it needs more), rather than the job
            # stopping with its budget unspent.
            # (Not for a fork already cut once: its rerun needs the worst case.)
            shrunk = None if worst else self._what_is_left(spec, estimate, output)
            if shrunk is None or not self.governor.try_reserve(key, shrunk):
                return None
            estimate, learned = shrunk, True
        if gate is not None and not gate(key, estimate):
            self.governor.release(key)
            return None
        if learned:
            self._learned.add(key)
        limit = SpendLimit(
            usd=estimate.usd,
            tokens=estimate.tokens,
            default_output_tokens=output,
            tokens_per_byte=self.tokens_per_byte,
        )
        return Item(spec, stage, attempt, limit, job_id=self.job_id), key

    def learned(self, key: str) -> bool:
        """Whether the attempt under ledger `key` was reserved at a learned estimate."""
        return key in self._learned

    def _what_is_left(self, spec: ForkSpec, estimate: Cost, output: int) -> Cost | None:
        if self.governor.in_flight:
            return None  # settling those may make room for the whole estimate
        left = self.governor.remaining()
        if left.forks == 0 or (left.wall_s is not None and left.wall_s <= 0):
            return None
        call = self._call_bound(spec, output)
        usd = estimate.usd if left.usd is None else min(estimate.usd, left.usd)
        tokens = estimate.tokens if left.tokens is None else min(estimate.tokens, left.tokens)
        if usd < call.usd or tokens < call.tokens:
            return None
        return Cost(forks=1, usd=usd, tokens=tokens)

    def tick(self) -> None:
        self.progress.spent = self.governor.spent
        elapsed = time.monotonic() - self.progress.started
        caps = self.budget
        if caps.max_forks and self.progress.done:
            used = self.governor.spent.forks + self.governor.reserved.forks
            rate = self.progress.done / max(elapsed, 1e-9)
            self.progress.eta_s = max(0.0, (caps.max_forks - used) / max(rate, 1e-9))
        self.on_progress(self.progress)

    # -- stages ------------------------------------------------------------------------------

    def enter(self, name: str) -> None:
        """Enter a stage: the last one's forks and wall time go into `stage_times`."""
        now = time.monotonic()
        entry = self.stage_times.setdefault(self.progress.stage, {"forks": 0, "wall_s": 0.0})
        entry["forks"] += self.progress.done - self._stage_done
        entry["wall_s"] = round(entry["wall_s"] + now - self._stage_started, 3)
        self.progress.stage = name
        self._stage_started = now
        self._stage_done = self.progress.done

    def plan(self) -> list[Stage]:
        """The job's stages, in order (each may hand over to others: `Next`)."""
        if self.spec.method == "auto":
            # The other arms first: with a seed-honouring provider each is one exact fork,
            # and Shapley may spend whatever the budget has left.
            return [HeldControl(self), HeldArms(self), HeldScreen(self)]
        return [Uniform(self)]

    def run(self) -> JobOutcome:
        """Run the job alone on its executor (`RunLoop` runs many at once)."""
        loop = RunLoop(self.executor)
        loop.add(self)
        loop.run()
        assert self.outcome is not None
        return self.outcome

    # -- the job as the run loop's source of forks ----------------------------------------------

    @property
    def window(self) -> int:
        """Forks of this job in flight at once: its provider's concurrency."""
        return self.spec.provider.concurrency

    def begin(self) -> bool:
        """Verify the tape and enter the first stage; False if the job ended already."""
        self.progress.stage = "verify"
        self.tick()
        check = self.executor.verify(self.tape.tape_id)
        if not check["ok"]:
            self.status = "verify_failed"
            self.notes.append(check["divergence"])
            self.outcome = self._finish()
            return False
        self._stages = self.plan()
        return self._enter_next()

    def _enter_next(self) -> bool:
        """Start the next stage of the plan; False (and the job finished) if none is left."""
        if not self._stages:
            self.status = "complete"
            self.outcome = self._finish()
            return False
        self.stage = self._stages.pop(0)
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
        refused it): hand over as it says (`Next`). True when the job has finished."""
        assert self.stage is not None
        then: Next = self.stage.done(exhausted)
        end = then.end or ("budget_exhausted" if exhausted else None)
        if end is not None:
            self.status = end
            self.outcome = self._finish()
            return True
        self._stages[:0] = then.then
        return not self._enter_next()

    def submitted(self, forks: int) -> None:
        self.on_submit()

    def received(self, rows: int = 0, lost: int = 0) -> None:
        self.progress.done += rows
        self.progress.lost += lost

    def in_flight_now(self, forks: int) -> None:
        self.progress.in_flight = forks

    def _rows(self, stage: str, tail: Tail) -> list[tuple[ForkSpec, dict[str, Any]]]:
        out = []
        for (st, _), rows in self.rows_by_arm.items():
            if st != stage:
                continue
            for row in rows:
                spec = ForkSpec.model_validate_json(row["spec"])
                if spec.tail == tail:
                    out.append((spec, row))
        return out

    # -- aggregate ----------------------------------------------------------------------------

    def _finish(self) -> JobOutcome:
        if self.screen is not None:  # the held screen and Shapley ran: what they found
            self.notes.extend(held_notes(self))
        # Each fork once, by its last row (a provider failure that was run again is not a
        # failed fork), and the forks given up.
        final = Counter(r["status"] for r in self.rows_by_task.values())
        final["provider_error"] += self.given_up
        total = sum(final.values())
        unscored = sum(final[s] for s in UNSCORED)
        if self.control_failed and self.status != "verify_failed":
            self.status = "control_failed"
        elif total and unscored / total > FAILED_SHARE and self.status != "verify_failed":
            counts = ", ".join(f"{final[s]} {s}" for s in sorted(UNSCORED))
            self.notes.append(
                f"FAILED: {unscored} of {total} forks have no outcome ({counts}); the "
                "attribution is not a sample of anything. See the rows' divergence, error and "
                "provider_status columns"
            )
            self.status = "failed"
        if self.progress.provider_errors:
            self.notes.append(
                f"{self.progress.provider_errors} forks failed at the provider and were run "
                "again (status provider_error: never scored)"
            )
        self.enter("aggregate")
        self.progress.in_flight = 0  # every fork asked for has settled or been given up
        self.sink.flush()
        rows = [self._stamped(r) for r in self.aggregate()]
        answer = (
            held_answer(self, self.status)
            if self.spec.method == "auto"
            else measured_answer(self, rows, self.status)
        )
        self.tick()
        return JobOutcome(self.job_id, self.status, rows, self.notes, self.progress, answer)

    def _stamped(self, row: dict[str, Any]) -> dict[str, Any]:
        """An attribution row as attribution.parquet holds it: with its job and the
        confidence level of its intervals, readable alone."""
        return {"job_id": self.job_id, **row, "confidence": self.spec.confidence}

    def aggregate(self) -> list[dict[str, Any]]:
        if self.spec.method == "auto":
            return self._aggregate_held()
        return self._aggregate_flips("uniform")

    def _record(self, arm: Arm) -> dict[str, Any]:
        event = self.steps[arm.step]
        return {
            "step": arm.step,
            "step_kind": event.type,
            "label": event.what() if isinstance(event, LlmEvent) else event.name,
            "intervention": arm.kind,
            **{
                f"{q}{suffix}": None
                for q in ("flip", "phi", "necessity", "sufficiency")
                for suffix in (("_rate", "_lo", "_hi") if q == "flip" else ("", "_lo", "_hi"))
            },
            "flip_n": 0,
            "phi_se": None,
            "necessity_n": 0,
            "sufficiency_n": 0,
            "rank": None,
        }

    def _flips(self, stage: str, arm: Arm) -> tuple[int, int]:
        rows = [r for r in self.rows_by_arm[(stage, arm.key)] if r["flipped"] is not None]
        return sum(bool(r["flipped"]) for r in rows), len(rows)

    def _aggregate_flips(self, stage: str) -> list[dict[str, Any]]:
        """Flip-rates per arm from one stage's forks, Wilson intervals, ranked by flip-rate
        within each intervention kind (the uniform scheme's table)."""
        out = []
        for arm in self.arms:
            record = self._record(arm)
            flips, n = self._flips(stage, arm)
            if n:
                lo, hi = wilson(flips, n, self.alpha)
                record.update(flip_rate=flips / n, flip_lo=lo, flip_hi=hi, flip_n=n)
            out.append(record)
        _rank(out, "flip_rate")
        return sorted(out, key=_table_order)

    def _aggregate_held(self) -> list[dict[str, Any]]:
        """The held-mechanism table: phi, necessity and sufficiency for the steps that make
        choices; 0 for steps the screen cleared (necessity_hi: how often they could still
        leave the tape); flip-rates of the other arms with a held tail."""
        estimates = self.seed_shapley.estimates() if self.seed_shapley is not None else {}
        out = []
        for arm in self.arms:
            record = self._record(arm)
            if arm.kind == "resample":
                if arm.step in estimates:
                    phi, nec, suf = estimates[arm.step]
                    record.update({k: v for k, v in _interval("phi", phi).items() if k != "phi_n"})
                    record.update(_interval("necessity", nec))
                    record.update(_interval("sufficiency", suf))
                    record.update(
                        flip_rate=nec.value, flip_lo=nec.low, flip_hi=nec.high, flip_n=nec.n
                    )
                elif (
                    self.screen is not None
                    and arm.step not in self.screen.hits
                    and self.screen.clean.get(arm.step, 0) > 0
                ):
                    bound = self.screen.deviation_bound(arm.step, self.alpha)
                    n = self.screen.clean[arm.step]
                    # Its blame is only bounded, not known to be 0: each of its marginal
                    # contributions needs it to leave the tape.
                    record.update(
                        phi=0.0,
                        phi_lo=-bound,
                        phi_hi=bound,
                        necessity=0.0,
                        necessity_lo=0.0,
                        necessity_hi=bound,
                        necessity_n=n,
                        flip_rate=0.0,
                        flip_lo=0.0,
                        flip_hi=bound,
                        flip_n=n,
                    )
            else:
                flips, n = self._flips("arms", arm)
                if n:
                    exact = self.honours_seed and not isinstance(arm.intervention, SwapPolicy)
                    lo, hi = (flips / n, flips / n) if exact else wilson(flips, n, self.alpha)
                    record.update(flip_rate=flips / n, flip_lo=lo, flip_hi=hi, flip_n=n)
            out.append(record)
        candidates = set(estimates)
        _rank(
            [r for r in out if r["intervention"] == "resample" and r["step"] in candidates], "phi"
        )
        _rank([r for r in out if r["intervention"] != "resample"], "flip_rate")
        return sorted(out, key=_table_order)


def _interval(name: str, e: Interval) -> dict[str, Any]:
    return {name: e.value, f"{name}_lo": e.low, f"{name}_hi": e.high, f"{name}_n": e.n}


def _rank(records: list[dict[str, Any]], key: str) -> None:
    """Rank measured records by `key` within each intervention kind (1 = first); records
    without a value get no rank. Equal values go by flip-rate (a re-drawn step's: its
    necessity, how often re-drawing it alone clears the failure); records equal in both
    share a rank (see `_share_ranks`)."""
    for kind in {r["intervention"] for r in records}:
        _share_ranks(
            [r for r in records if r["intervention"] == kind and r[key] is not None],
            lambda r: (-r[key], -(r.get("flip_rate") or 0.0)),
        )


def _share_ranks(
    records: list[dict[str, Any]], order: Callable[[dict[str, Any]], tuple[float, ...]]
) -> None:
    """Competition ranks (1, 1, 3) by `order`: records the measurements cannot tell apart
    share a rank, and the next rank skips past them. Steps tied at φ 0 with no flips (one
    seed that flipped nowhere) are a tie, not a ranking by step number: a table whose rank
    1 is the lowest step of a tie would name a cause the forks never saw."""
    records.sort(key=lambda r: (order(r), r["step"]))
    for i, r in enumerate(records):
        same = i > 0 and order(records[i - 1]) == order(r)
        r["rank"] = records[i - 1]["rank"] if same else i + 1


def _table_order(r: dict[str, Any]) -> tuple[bool, str, int, int]:
    """Re-drawn steps first (the steps to fix, by blame), then each other kind; by rank."""
    rank = r["rank"] if r["rank"] is not None else 1 << 30
    return (r["intervention"] != "resample", r["intervention"], rank, r["step"])


def _counter(stage: str, arm_key: str) -> tuple[str, str]:
    """The seed counter a fork draws from. Forks whose specs could coincide share one, so
    no two stages ever make the same task: screen and race count per arm together (the
    race goes on from the screen's seeds), and the pinned-everything controls share the
    Shapley counter (they are its empty coalition)."""
    if stage in ("screen", "race"):
        return ("flip", arm_key)
    if stage == "shapley" or (stage == "controls" and arm_key == "pinned"):
        return ("coalition", _seed_key(stage, arm_key))
    return (stage, arm_key)


def _seed_key(stage: str, arm_key: str) -> str:
    """Which forks share a seed counter. Screen and race count per arm, so the j-th fork of
    every arm uses seed j: common random numbers make flip-rates of different steps
    comparable. Shapley counts over the whole stage, so every coalition draws fresh seeds:
    with Neyman allocation giving most coalitions a handful of forks, shared seeds would make
    all of them see the same few draws (measured on the demo: every coalition holding the
    decision step saw seeds 0-2 only, and phi collapsed toward zero with a tiny variance)."""
    return "all" if stage in ("shapley", "controls") else arm_key
