"""The attribution job: verify → controls → screen → race → shapley → aggregate.

Every stage is gated on the one before and on the budget. Forks go to the executor in
batches; rows stream into the Parquet sink and the estimators as they arrive. A restarted
job feeds the rows already written back into the estimators and never runs a task id twice:
seeds are counted per arm (see `_counter`), so the j-th fork of an arm is always the same task."""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import structlog

from .._canon import canonical_bytes, digest_of
from ..execute import BatchLost, Executor, Item, RowSink
from ..job import Job
from ..providers import PriceTable
from ..replay import (
    ForkSpec,
    Intervention,
    Resample,
    SpendLimit,
    SwapPolicy,
    Tail,
    call_bound,
    is_bad,
)
from ..tape import LlmEvent, Tape, ToolEvent
from ._budget import Budget, BudgetGovernor, Cost, ReservationExceeded
from ._estimators import Race, ShapleyPlanner, confidence_sequence, shapley_planner, wilson
from ._mechanism import DeviationScreen, Interval, SeedShapley

log = structlog.get_logger("car_ray.schedule")

CONTROL_HINT = (
    "the agent is not deterministic under replay. Usual causes: a client or cache shared "
    "across concurrent runs (a module-level SDK client, a global conversation list), ids or "
    "timestamps in request bodies not taken from ctx.now / ctx.uuid4, randomness not from "
    "ctx.random. Check: `car-ray fork TAPE --job JOB.toml --step 0 --tail pinned` twice; "
    "both rows must show the tape's outcome and no divergence"
)
CONTROL_FORKS = 4
BASE_RATE_FORKS = 8
SCREEN_FORKS = 4
RACE_SHARE = 0.4  # of what is left after screening; the rest goes to Shapley
MIN_FORKS_PER_COALITION = 4
OUTPUT_FLOOR_TOKENS = 256
LEARNED_OUTPUT_FLOOR = 32
DEFAULT_MAX_FORKS = 2000  # when a job sets no cap at all (legacy methods)
DEFAULT_FORKS_PER_STEP = 10  # the auto method's cap when a job sets none: 10 forks a step
# The screen clears steps lazily. Its first pass stops at SCREEN_FIRST clean re-draws a step
# (a step leaving the tape 30% of the time is missed 6% of the time, and a later pass may
# still find it); Shapley then runs over what it found, and the screen goes on only while a
# step it has not found could still outrank the top: until every such step's deviation
# bound is below the top's phi_lo (at most SCREEN_MOST re-draws). When nothing makes a choice
# the screen clears to SCREEN_CLEAN (a step leaving the tape 20% of the time is missed 1.2%).
SCREEN_FIRST = 8
SCREEN_CLEAN = 20
SCREEN_MOST = 60
# Shapley seeds of the held game are fork seeds from here on (of the attribution's 2^32): the
# screen's forks count from 0 and pick the candidates, so Shapley seeds that were the screen's
# would see every step it found leave the tape (a selection bias toward the found steps).
SHAPLEY_SEEDS = 1 << 31
SCREEN_IN_FLIGHT = 4  # screen forks at once (each one's block depends on the ones before)
ARM_FORKS = 8  # forks of an arm whose forks are not deterministic
TAIL_SLACK = 2  # a live tail may make this many times the recorded calls before it is cut
# A job's statuses that are a failed job: its CLI exits non-zero.
FAILED_STATUSES = frozenset({"verify_failed", "control_failed", "failed"})
# A fork's reservation is learned from settled forks of its shape (`Scheduler._shapes`) once
# there are this many: their most live calls, each at a call bound with a learned output.
# A fork that needs more is cut and run once more at the worst case.
LEARN_AFTER = 4
PROVIDER_ATTEMPTS = 4  # runs of a fork whose provider keeps failing before it is given up
# A job whose forks mostly end unscored (divergence, error, provider_error) has failed: its
# few scored forks are not a sample of anything.
FAILED_SHARE = 0.5
UNSCORED = frozenset({"divergence", "error", "provider_error"})


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
    """Runs one attribution job over one tape with an executor and a sink."""

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
        # Every fork seed derives from the attribution's seed: the j-th fork of a counter has
        # seed base + j, and fresh draws hash (seed, step).
        self.seed_base = self.spec.attribution_seed << 32
        # The simulated provider honours seeds: a held fork with no fresh draw is then
        # deterministic, and one fork is its exact value.
        self.honours_seed = self.spec.provider.base_url is None
        self.screen: DeviationScreen | None = None
        self.seed_shapley: SeedShapley | None = None
        self.verdict: tuple[str, list[int]] | None = None
        self.shapley: ShapleyPlanner[int] | None = None
        self.races: dict[str, Race[str]] = {}
        # Shapley's candidate steps, once chosen (a resumed job passes its first run's choice
        # from job.json: its flip-rates, and so its choice, may differ now).
        self.candidates: list[int] = sorted(candidates or [])
        for row in already or []:
            self._remember(row)
        self.progress.resumed = len(already or [])

    # -- arms and specs --------------------------------------------------------------------

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

    def _remember(self, row: dict[str, Any]) -> None:
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
        key = _arm_key(stage, spec)
        counter = _counter(stage, key)
        self.seed_next[counter] = max(self.seed_next[counter], spec.seed - self.seed_base + 1)
        self.rows_by_arm[(stage, key)].append(row)

    # -- running forks ------------------------------------------------------------------------

    def _run(
        self,
        next_batch: Callable[[int], list[tuple[str, ForkSpec]] | None],
        on_row: Callable[[dict[str, Any]], None],
        on_unrun: Callable[[ForkSpec], None] = lambda spec: None,
    ) -> bool:
        """Run the forks a stage asks for until it says it is done (`next_batch` returns
        None; an empty list means "nothing until more results arrive") or the budget refuses
        one; True if the budget ran out. A lost batch (its worker died) is retried under a
        new reservation, the lost attempt counted as spent."""
        window = self.spec.provider.concurrency
        exhausted = stage_done = False
        keys: dict[str, str] = {}
        queue: list[Any] = []
        # Forks the governor refused while others were in flight: reservations are upper
        # bounds, so settling those may free room. Only a refusal with nothing in flight
        # means the budget is spent.
        waiting: list[tuple[str, ForkSpec]] = []

        def again(stage: str, spec: ForkSpec, attempt: int, *, worst: bool = False) -> None:
            """Run a fork once more under a new ledger key (its last attempt is settled or
            lost). Refused, it waits while any reservation is open: rows of this result not
            yet settled, forks in flight or queued may free room."""
            nonlocal exhausted
            attempts[spec.task_id] = attempt + 1
            retry = self._reserve(stage, spec, keys, attempt + 1, worst=worst)
            if retry is not None:
                queue.append(retry)
            elif self.governor.in_flight:
                waiting.append((stage, spec))
            else:
                exhausted = True
                on_unrun(spec)

        # Attempts count per fork over the whole job: a stage may ask again for a fork an
        # earlier stage gave up on, and every attempt needs its own ledger key.
        attempts = self.attempts
        while True:
            room = window - self.executor.in_flight - len(queue)
            asked = False
            if not exhausted and room > 0 and (waiting or not stage_done):
                if waiting:
                    batch, waiting = waiting, []
                else:
                    asked = True
                    got = next_batch(room)
                    stage_done = got is None
                    batch = got or []
                for i, (stage, spec) in enumerate(batch):
                    task = spec.task_id
                    if task in self.rows_by_task:  # written by an earlier run of this job
                        on_row(self.rows_by_task[task])
                        continue
                    item = self._reserve(stage, spec, keys, attempts.get(task, 0))
                    if item is None:
                        if self.executor.in_flight or queue:
                            waiting = batch[i:]
                        else:
                            exhausted = True
                            for _, unrun in batch[i:]:
                                on_unrun(unrun)
                        break
                    queue.append(item)
            if queue:
                # The ledger reaches job.json before the forks reach a worker: a driver
                # killed now leaves a successor that counts them as (possibly) spent.
                self.on_submit()
                self.executor.submit(queue)
                queue = []
            if self.executor.in_flight == 0:
                if exhausted or (stage_done and not waiting):
                    return exhausted
                if asked and not batch and not waiting:
                    # The stage wants nothing and nothing is in flight: it cannot progress.
                    return exhausted
                continue
            self.progress.in_flight = self.executor.in_flight
            for result in self.executor.wait(0.25):
                if isinstance(result, BatchLost):
                    self.progress.lost += len(result.items)
                    for item in result.items:
                        self.governor.lose(keys.pop(item.spec.task_id))
                        again(item.stage, item.spec, item.attempt)
                    continue
                for row in result:
                    row["job_id"] = self.job_id
                    row["finished_at"] = datetime.now(UTC)
                    ledger_key = keys.pop(row["task_id"])
                    try:
                        self.governor.settle(
                            ledger_key,
                            Cost(1, row["cost_usd"], row["tokens_in"] + row["tokens_out"]),
                        )
                    except ReservationExceeded as exc:
                        # The ledger has the true spend; say so rather than stop the job.
                        self.notes.append(f"OVERSPENT: {exc}")
                        log.warning("reservation_exceeded", task=row["task_id"], error=str(exc))
                    if row["status"] == "budget_cut" and ledger_key in self._learned:
                        # The learned reservation was too small for this one: keep its row
                        # (it was paid for) and run it again at the worst case.
                        spec = self._keep_attempt(row, "cut")
                        again(row["stage"], spec, row["attempt"], worst=True)
                        continue
                    if row["status"] == "provider_error":
                        failures = self.provider_failed[row["task_id"]]
                        spec = self._keep_attempt(row, f"p{failures}")
                        if failures + 1 >= PROVIDER_ATTEMPTS:
                            # Its next attempt (if a stage asks again) has a fresh key.
                            attempts[spec.task_id] = row["attempt"] + 1
                            self.given_up += 1
                            self.notes.append(
                                f"gave up a fork after {PROVIDER_ATTEMPTS} provider failures "
                                f"(last: {row['error']})"
                            )
                            on_unrun(spec)
                            continue
                        again(row["stage"], spec, row["attempt"])
                        continue
                    added = self.sink.add(row)
                    if added or row["task_id"] not in self.rows_by_task:
                        # A row the sink refuses is one it already holds on disk (another
                        # run of this job wrote it after this one read the output): it is
                        # still this fork's result, and the estimators must see it once.
                        self._remember(row)
                        on_row(row)
                    else:  # pragma: no cover - a task is never submitted twice
                        on_unrun(ForkSpec.model_validate_json(row["spec"]))
                    self.progress.done += 1
            self.sink.maybe_flush()
            self._tick()

    def _keep_attempt(self, row: dict[str, Any], suffix: str) -> ForkSpec:
        """Write a paid attempt that is not the fork's answer (a provider failure, a cut at
        a learned reservation) under its own row id, `<task>/<suffix>`: the fork's task id
        stays free for the run that answers. Counted, never scored."""
        self.progress.done += 1
        spec = ForkSpec.model_validate_json(row["spec"])
        row["task_id"] = f"{spec.task_id}/{suffix}"
        self.sink.add(row)
        self._remember(row)
        return spec

    def _reserve(
        self,
        stage: str,
        spec: ForkSpec,
        keys: dict[str, str],
        attempt: int = 0,
        *,
        worst: bool = False,
    ) -> Item | None:
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
        if learned:
            self._learned.add(key)
        keys[spec.task_id] = key
        return Item(
            spec,
            stage,
            attempt,
            SpendLimit(
                usd=estimate.usd,
                tokens=estimate.tokens,
                default_output_tokens=output,
                tokens_per_byte=self.tokens_per_byte,
            ),
        )

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

    def _tick(self) -> None:
        self.progress.spent = self.governor.spent
        elapsed = time.monotonic() - self.progress.started
        caps = self.budget
        if caps.max_forks and self.progress.done:
            used = self.governor.spent.forks + self.governor.reserved.forks
            rate = self.progress.done / max(elapsed, 1e-9)
            self.progress.eta_s = max(0.0, (caps.max_forks - used) / max(rate, 1e-9))
        self.on_progress(self.progress)

    # -- stages ------------------------------------------------------------------------------

    def _stage(self, name: str) -> None:
        """Enter a stage: the last one's forks and wall time go into `stage_times`."""
        now = time.monotonic()
        entry = self.stage_times.setdefault(self.progress.stage, {"forks": 0, "wall_s": 0.0})
        entry["forks"] += self.progress.done - self._stage_done
        entry["wall_s"] = round(entry["wall_s"] + now - self._stage_started, 3)
        self.progress.stage = name
        self._stage_started = now
        self._stage_done = self.progress.done

    def run(self) -> JobOutcome:
        self.progress.stage = "verify"
        self._tick()
        check = self.executor.verify(self.tape.tape_id)
        if not check["ok"]:
            self.status = "verify_failed"
            self.notes.append(check["divergence"])
            return self._finish()
        if self.spec.method == "auto":
            # The other arms first: with a seed-honouring provider each is one exact fork,
            # and Shapley may spend whatever the budget has left.
            if self._held_control():
                self.status = "budget_exhausted"
                return self._finish()
            if self.control_failed:
                # Every fork after it would measure the nondeterminism, not the steps.
                self.status = "control_failed"
                return self._finish()
            out_of_budget = self._held_arms() or self._screen_and_shapley()
            self.status = "budget_exhausted" if out_of_budget else "complete"
            return self._finish()
        if self.spec.method == "uniform":
            self.status = "budget_exhausted" if self._uniform() else "complete"
            return self._finish()
        out_of_budget = self._controls()
        if self.control_failed:
            return self._finish()
        if not out_of_budget:
            out_of_budget = self._screen()
        if not out_of_budget and self.spec.method in ("auto", "flip"):
            out_of_budget = self._race()
        if not out_of_budget and self.spec.method in ("auto", "shapley"):
            out_of_budget = self._shapley()
        self.status = "budget_exhausted" if out_of_budget else "complete"
        return self._finish()

    # -- the held-mechanism attribution (method "auto") ----------------------------------------

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

    def _held_control(self) -> bool:
        """The negative control: nothing intervened, every step held. It must reproduce the
        recorded outcome (with a seed-honouring provider it is the replay: no live call)."""
        self._stage("controls")
        plan = iter([("controls", self._spec("controls", "held", {}, "held", 0))])
        exhausted = self._run(lambda room: list(itertools.islice(plan, room)) or None, _ignore)
        rows = [r for _, r in self._rows("controls", "held")]
        bad = [r for r in rows if r["outcome"] != r["recorded_outcome"]]
        # A control that never ran (its provider failed every try) controls nothing.
        missing = not rows and not exhausted
        if missing or bad or any(r["status"] in UNSCORED | {"budget_cut"} for r in rows):
            self.control_failed = True
            what = (
                rows[0]["divergence"] or rows[0]["error"]
                if rows
                else "it never ran: its provider failed every try"
            )
            self.notes.append(
                "NEGATIVE CONTROL FAILED: the fork that changes nothing did not reproduce the "
                f"recorded outcome{f' ({what})' if what else ''}; {CONTROL_HINT}"
            )
            log.warning("control_failed", status=rows[0]["status"] if rows else None)
        return exhausted

    def _screen_and_shapley(self) -> bool:
        """The screen, then Shapley over the steps it found, screening on beside it while a
        step it has not found could still outrank the top (see SCREEN_FIRST); Shapley starts
        over when the screen finds another step. True if the budget ended first."""
        steps = [a.step for a in self.arms if a.kind == "resample"]
        screen = DeviationScreen(steps, clean_needed=SCREEN_FIRST)
        self.screen = screen
        for spec, row in self._rows("screen", "held"):
            if row["outcome"] is not None:
                screen.observe(sorted(spec.interventions), row["first_deviation"])
        exhausted = self._deviation_screen()
        while not exhausted:
            if not screen.candidates:
                if screen.clean_needed >= SCREEN_CLEAN:
                    self.verdict = ("separated", [])
                    break
                # Nothing found yet: clear every step to SCREEN_CLEAN before saying so.
                screen.clean_needed = SCREEN_CLEAN
                exhausted = self._deviation_screen()
                continue
            found = len(screen.candidates)
            exhausted = self._seed_shapley()
            if len(screen.candidates) == found:
                break
        if screen.strays:
            self.notes.append(
                f"screen: {screen.strays} forks left the tape at a step they did not re-draw "
                "(nondeterminism outside the context's seams?)"
            )
        self.notes.append(
            f"screen: {screen.forks} forks; steps that make choices: {screen.candidates or 'none'}"
        )
        shap = self.seed_shapley
        n = len(shap.complete_seeds()) if shap is not None else 0
        if self.verdict is None:
            self.notes.append(f"shapley: {n} seeds; the budget ended before the top separated")
        elif self.verdict[1]:
            self.notes.append(
                f"shapley: {n} seeds; top cause {self.verdict[1]} {self.verdict[0]} at "
                f"{self.spec.confidence:.0%}"
            )
        else:
            self.notes.append("shapley: no step makes a choice that could change the outcome")
        # A verdict that stands when the budget ends is an answer: the job is complete.
        return exhausted and self.verdict is None

    def _screen_forks(self, room: int, pending: int) -> list[tuple[str, ForkSpec]]:
        """Up to `room` forks of the screen's block (at most SCREEN_IN_FLIGHT in flight)."""
        assert self.screen is not None
        block = self.screen.block()
        if not block:
            return []
        plan: dict[int, Intervention] = {k: Resample() for k in block}
        n = max(0, min(room, SCREEN_IN_FLIGHT - pending))
        return [("screen", self._spec("screen", "block", plan, "held")) for _ in range(n)]

    def _deviation_screen(self) -> bool:
        """Which steps ever choose differently: blocks of steps re-drawn together, held tail
        (see `DeviationScreen`), until every step not found has its clean draws."""
        self._stage("screen")
        screen = self.screen
        assert screen is not None
        pending = 0

        def on_row(row: dict[str, Any]) -> None:
            nonlocal pending
            pending -= 1
            if row["outcome"] is not None:
                spec = ForkSpec.model_validate_json(row["spec"])
                screen.observe(sorted(spec.interventions), row["first_deviation"])

        def on_unrun(spec: ForkSpec) -> None:
            nonlocal pending
            pending -= 1

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            nonlocal pending
            if screen.done():
                return None
            out = self._screen_forks(room, pending)
            pending += len(out)
            return out

        return self._run(next_batch, on_row, on_unrun)

    def _seed_shapley(self) -> bool:
        """Shapley blame over the steps the screen found, one seed at a time (see
        `SeedShapley`), until the top cause is separated or the intervals are precise, with
        the screen's clearance behind the verdict: every step the screen has not found has
        a deviation bound (which bounds its |phi|) below the top's phi_lo, or below the
        target half-width when the verdict is "precise". While it is not, each fork goes
        where it narrows that gap most: a screen fork lowers the bound, a Shapley seed
        raises phi_lo. Returns (early) when the screen finds another step."""
        self._stage("shapley")
        screen = self.screen
        assert screen is not None
        shap = SeedShapley(screen.candidates, self.alpha, salt=str(self.spec.attribution_seed))
        self.seed_shapley = shap
        self.verdict = None
        self.candidates = list(shap.candidates)
        coalitions_of: dict[int, set[frozenset[int]]] = {}
        for spec, row in self._rows("shapley", "held"):
            seed = self._shapley_seed(spec)
            coalition = frozenset(spec.interventions)
            if coalition in coalitions_of.setdefault(seed, set(shap.coalitions(seed))):
                _observe(shap, seed, coalition, row)
        pending: set[tuple[int, frozenset[int]]] = set()
        screening: set[str] = set()
        per_seed = max(1, len(shap.coalitions(0)))
        target = self.spec.target_half_width

        def on_row(row: dict[str, Any]) -> None:
            spec = ForkSpec.model_validate_json(row["spec"])
            if spec.task_id in screening:
                screening.discard(spec.task_id)
                if row["outcome"] is not None:
                    screen.observe(sorted(spec.interventions), row["first_deviation"])
                return
            seed, coalition = self._shapley_seed(spec), frozenset(spec.interventions)
            pending.discard((seed, coalition))
            _observe(shap, seed, coalition, row)

        def on_unrun(spec: ForkSpec) -> None:
            if spec.task_id in screening:
                screening.discard(spec.task_id)
                return
            seed, coalition = self._shapley_seed(spec), frozenset(spec.interventions)
            pending.discard((seed, coalition))
            # A seed missing a coalition is incomplete: its other forks are not asked again.
            shap.observe(seed, coalition, None)

        def seeds(room: int) -> list[tuple[str, ForkSpec]]:
            room = min(room, max(2 * per_seed, 8) - len(pending))
            out: list[tuple[str, ForkSpec]] = []
            seed = 0
            while len(out) < room:
                first = shap.first(seed)
                if seed in shap.failed or (seed, first) in pending:
                    # The seed's other coalitions wait for its first: it may settle them.
                    seed += 1
                    continue
                todo = [first] if not shap.known(seed, first) else shap.coalitions(seed)
                for coalition in todo:
                    if len(out) >= room:
                        break
                    if shap.known(seed, coalition) or (seed, coalition) in pending:
                        continue
                    pending.add((seed, coalition))
                    plan: dict[int, Intervention] = {k: Resample() for k in coalition}
                    key = ",".join(map(str, sorted(coalition)))
                    fork_seed = SHAPLEY_SEEDS + seed
                    out.append(("shapley", self._spec("shapley", key, plan, "held", fork_seed)))
                seed += 1
            return out

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            if screen.candidates != shap.candidates:
                return None  # the screen found another step: Shapley starts over
            verdict = shap.verdict(target)
            if verdict is None or not self._may_stop(shap, target):
                return seeds(room)
            if self._stands(shap, verdict):
                self.verdict = verdict
                return None
            if self._screen_gain() >= self._seed_gain(shap, verdict):
                out = self._screen_forks(room, len(screening))
                screening.update(spec.task_id for _, spec in out)
                return out
            return seeds(room)

        exhausted = self._run(next_batch, on_row, on_unrun)
        if exhausted and screen.candidates == shap.candidates:
            # The budget ended: the verdict of every fork it paid for may stand all the same.
            verdict = shap.verdict(target)
            if verdict is not None and self._may_stop(shap, target) and self._stands(shap, verdict):
                self.verdict = verdict
        return exhausted

    def _stands(self, shap: SeedShapley, verdict: tuple[str, list[int]]) -> bool:
        """Whether Shapley's verdict has the screen's clearance behind it: every step not
        found has a deviation bound below what the verdict needs (`_clearance`), or was
        screened as far as the screen goes (SCREEN_MOST). If not, the screen is asked for
        the clean draws that would do."""
        screen = self.screen
        assert screen is not None
        if not verdict[1]:
            return True
        need = self._clearance(shap, verdict)
        bound = max((screen.deviation_bound(k, self.alpha) for k in self._unfound()), default=0)
        if bound < need:
            return True
        clean = DeviationScreen.clean_for(need, self.alpha) if need > 0 else SCREEN_MOST
        screen.clean_needed = min(SCREEN_MOST, clean)
        return screen.done()

    def _shapley_seed(self, spec: ForkSpec) -> int:
        """Which seed of the Shapley stage a fork belongs to."""
        return spec.seed - self.seed_base - SHAPLEY_SEEDS

    def _unfound(self) -> list[int]:
        """The resample steps the screen has not seen leave the tape."""
        assert self.screen is not None
        return [k for k in self.screen.steps if k not in self.screen.hits]

    def _clearance(self, shap: SeedShapley, verdict: tuple[str, list[int]]) -> float:
        """The deviation bound a step not found must be below for `verdict` to stand."""
        if verdict[0] != "separated":
            return self.spec.target_half_width
        estimates = shap.estimates()
        return max(0.0, min(estimates[k][0].low or 0.0 for k in verdict[1]))

    def _screen_gain(self) -> float:
        """How much one more screen fork lowers the largest deviation bound of a step not
        found."""
        assert self.screen is not None
        n = min((self.screen.clean.get(k, 0) for k in self._unfound()), default=0)
        bound = DeviationScreen.bound_after
        return bound(n, self.alpha) - bound(n + 1, self.alpha)

    def _seed_gain(self, shap: SeedShapley, verdict: tuple[str, list[int]]) -> float:
        """How much one more fork of Shapley seeds raises the top's phi_lo (its half-width
        falls as 1 / sqrt(seeds): by about h / 2s a seed, a seed being one fork a coalition).
        A "precise" verdict waits on the bound alone: seeds do not help it."""
        if verdict[0] != "separated":
            return 0.0
        estimates = shap.estimates()
        seeds = max(1, len(shap.complete_seeds()))
        half = max(estimates[k][0].half_width for k in verdict[1])
        if half == float("inf"):
            return float("inf")
        return half / (2 * seeds) / max(1.0, shap.forks_per_seed())

    def _may_stop(self, shap: SeedShapley, target: float) -> bool:
        """Whether a verdict ends the Shapley stage: always, unless `precise_only` asks for
        every phi interval within `target` (a separated top is not enough then)."""
        if not self.precise_only:
            return True
        return all(phi.half_width <= target for phi, _, _ in shap.estimates().values())

    def _held_arms(self) -> bool:
        """Every other arm (observation, action, context, policy) with a held tail: one fork
        when the provider honours seeds and the fork draws nothing fresh (it is then exact),
        ARM_FORKS otherwise."""
        self._stage("arms")
        plan: list[tuple[Arm, int]] = []
        for arm in self.arms:
            if arm.kind == "resample":
                continue
            exact = self.honours_seed and not isinstance(arm.intervention, SwapPolicy)
            plan.extend((arm, j) for j in range(1 if exact else ARM_FORKS))
        given = iter(plan)

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            out = [
                ("arms", self._spec("arms", arm.key, {arm.step: arm.intervention}, "held", j))
                for arm, j in itertools.islice(given, room)
            ]
            return out or None

        return self._run(next_batch, _ignore)

    def _uniform(self) -> bool:
        """The uniform scheme: `forks_per_step` forks of every arm, one tail for all."""
        self._stage("uniform")
        k, tail = self.spec.forks_per_step, self.spec.uniform_tail
        given = iter([(arm, j) for j in range(k) for arm in self.arms])

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            out = [
                ("uniform", self._spec("uniform", arm.key, {arm.step: arm.intervention}, tail, j))
                for arm, j in itertools.islice(given, room)
            ]
            return out or None

        return self._run(next_batch, _ignore)

    def _controls(self) -> bool:
        self._stage("controls")
        all_steps: dict[int, Intervention] = {k: Resample() for k in range(len(self.steps))}
        plan: list[tuple[str, dict[int, Intervention], Tail, int]] = [
            ("pinned", {}, "pinned", j) for j in range(CONTROL_FORKS)
        ] + [("base", all_steps, "live", j) for j in range(BASE_RATE_FORKS)]
        given = iter(plan)

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            out = [
                ("controls", self._spec("controls", key, dict(p), tail, seed))
                for key, p, tail, seed in itertools.islice(given, room)
            ]
            return out or None

        exhausted = self._run(next_batch, lambda row: None)
        pinned = self.rows_by_arm[("controls", "pinned")]
        bad = [r for r in pinned if r["outcome"] != r["recorded_outcome"]]
        if bad or any(r["status"] in UNSCORED | {"budget_cut"} for r in pinned):
            self.control_failed = True
            self.notes.append(
                f"NEGATIVE CONTROL FAILED: {len(bad)} of {len(pinned)} pinned-everything forks "
                f"did not reproduce the recorded outcome; {CONTROL_HINT}"
            )
            log.warning("control_failed", failures=len(bad))
        base = [r for r in self.rows_by_arm[("controls", "base")] if r["outcome"] is not None]
        if base:
            rate = sum(is_bad(r["outcome"]) for r in base) / len(base)
            self.notes.append(
                f"base rate (everything re-drawn): {rate:.2f} bad over {len(base)} forks"
            )
        return exhausted

    def _arm_rows(self, arm: Arm) -> list[dict[str, Any]]:
        return self.rows_by_arm[("screen", arm.key)] + self.rows_by_arm[("race", arm.key)]

    def _screen(self) -> bool:
        self._stage("screen")
        plan = iter([(arm, j) for j in range(SCREEN_FORKS) for arm in self.arms])

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            out = [
                (
                    "screen",
                    self._spec("screen", arm.key, {arm.step: arm.intervention}, "live", seed),
                )
                for arm, seed in itertools.islice(plan, room)
            ]
            return out or None

        return self._run(next_batch, lambda row: None)

    def _race(self) -> bool:
        self._stage("race")
        by_key = {arm.key: arm for arm in self.arms}
        for arm in self.arms:
            race = self.races.setdefault(
                arm.kind, Race([a.key for a in self.arms if a.kind == arm.kind], alpha=self.alpha)
            )
            for row in self._arm_rows(arm):
                if row["flipped"] is not None:
                    race.update(arm.key, float(row["flipped"]))
        # With Shapley to follow, the race keeps to its share; alone, it may use it all.
        quota = self._quota(RACE_SHARE if self.spec.method == "auto" else 1.0)
        sent = 0

        def on_row(row: dict[str, Any]) -> None:
            key = _arm_key("race", ForkSpec.model_validate_json(row["spec"]))
            race = self.races[by_key[key].kind]
            if row["flipped"] is None:
                race.cancel(key)
            else:
                race.update(key, float(row["flipped"]))
            self.progress.leader = _leader_text(self.races)

        def on_unrun(spec: ForkSpec) -> None:
            key = _arm_key("race", spec)
            self.races[by_key[key].kind].cancel(key)

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            nonlocal sent
            target = self.spec.target_half_width
            open_races = [r for r in self.races.values() if r.done(target) is None]
            if not open_races or sent >= quota:
                return None
            out: list[tuple[str, ForkSpec]] = []
            for race in open_races:
                for key in race.next_arms(max(1, min(room, quota - sent) // len(open_races))):
                    arm = by_key[key]
                    out.append(
                        ("race", self._spec("race", key, {arm.step: arm.intervention}, "live"))
                    )
                    sent += 1
            return out

        exhausted = self._run(next_batch, on_row, on_unrun)
        for kind, race in self.races.items():
            verdict = race.done(self.spec.target_half_width)
            leader = race.leader()
            self.notes.append(
                f"race ({kind}): "
                + (
                    f"{verdict}, leader {leader}"
                    if verdict
                    else "stopped by its share of the budget"
                )
            )
        return exhausted

    def _quota(self, share: float) -> int:
        """Forks a stage may plan for: a share of what the caps leave, at the mean cost of
        the forks run so far. Only a plan: the governor enforces the caps."""
        left = self.governor.remaining()
        done = [r for r in self.rows_by_task.values()]
        counts = []
        if left.forks is not None:
            counts.append(left.forks)
        if left.usd is not None:
            per_usd = max(1e-12, sum(r["cost_usd"] for r in done) / max(1, len(done)))
            counts.append(int(left.usd / per_usd))
        if left.tokens is not None:
            per_tok = max(
                1.0, sum(r["tokens_in"] + r["tokens_out"] for r in done) / max(1, len(done))
            )
            counts.append(int(left.tokens / per_tok))
        return int(share * min(counts)) if counts else DEFAULT_MAX_FORKS

    def _shapley(self) -> bool:
        self._stage("shapley")
        resample = [a for a in self.arms if a.kind == "resample"]
        if len(resample) < 2:
            return False
        rates = {a.step: _rate(self._arm_rows(a)) for a in resample}
        saved = list(self.candidates)
        self.candidates = self._shapley_candidates(rates)
        size = len(self.candidates)
        if saved:
            added = sorted(set(self.candidates) - set(saved))
            self.notes.append(
                f"shapley over steps {self.candidates}: the candidates this job chose before "
                f"it was restarted ({saved})"
                + (f", and {added} the budget now allows" if added else "")
            )
        elif size < len(rates):
            self.notes.append(
                f"shapley over the top {size} of {len(rates)} steps by flip-rate "
                f"({self.candidates}): the budget left allows no more"
            )
        planner: ShapleyPlanner[int] = shapley_planner(self.candidates, alpha=self.alpha)
        self.shapley = planner
        for (stage, key), rows in self.rows_by_arm.items():
            if stage != "shapley":
                continue
            coalition = frozenset(int(k) for k in key.split(",") if k)
            if coalition <= set(self.candidates):
                for row in rows:
                    if row["outcome"] is not None:
                        # The fork's seed: forks sharing it are one cluster (common randomness).
                        seed = ForkSpec.model_validate_json(row["spec"]).seed
                        planner.update(coalition, float(is_bad(row["outcome"])), seed=seed)

        def on_row(row: dict[str, Any]) -> None:
            spec = ForkSpec.model_validate_json(row["spec"])
            coalition = frozenset(spec.interventions)
            if row["outcome"] is None:
                planner.cancel(coalition)
            else:
                planner.update(coalition, float(is_bad(row["outcome"])), seed=spec.seed)

        def on_unrun(spec: ForkSpec) -> None:
            planner.cancel(frozenset(spec.interventions))

        def next_batch(room: int) -> list[tuple[str, ForkSpec]] | None:
            estimates = planner.estimates()
            measured = planner.counts
            if len(measured) == 2 ** len(self.candidates) and all(
                (a.phi.high - a.phi.low) / 2 <= self.spec.target_half_width
                for a in estimates.steps.values()
            ):
                return None
            out = []
            for coalition in planner.next_coalitions(room):
                key = ",".join(map(str, sorted(coalition)))
                plan: dict[int, Intervention] = {k: Resample() for k in coalition}
                out.append(("shapley", self._spec("shapley", key, plan, "pinned")))
            return out

        return self._run(next_batch, on_row, on_unrun)

    def _shapley_candidates(self, rates: dict[int, float]) -> list[int]:
        """As many steps (by flip-rate, at most ten) as the budget can give every coalition a
        few forks: 2^k coalitions, MIN_FORKS_PER_COALITION each. A resumed job keeps the
        steps its first run chose (saved in job.json; from an older job.json, the steps its
        written coalitions name), so the rows already written stay usable, and adds the next
        steps by flip-rate if its budget now allows more: v(S) does not depend on which
        other steps are candidates."""
        kept = set(self.candidates) or {
            int(k)
            for (stage, key) in self.rows_by_arm
            if stage == "shapley"
            for k in key.split(",")
            if k
        }
        left = self._quota(1.0)
        size = 2
        while size < min(10, len(rates)) and 2 ** (size + 1) * MIN_FORKS_PER_COALITION <= left:
            size += 1
        for k in sorted(rates, key=lambda k: (-rates[k], k)):
            if len(kept) >= size:
                break
            kept.add(k)
        return sorted(kept)

    # -- aggregate ----------------------------------------------------------------------------

    def _finish(self) -> JobOutcome:
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
        self._stage("aggregate")
        self.progress.in_flight = 0  # every fork asked for has settled or been given up
        self.sink.flush()
        rows = [self._stamped(r) for r in self.aggregate()]
        self._tick()
        return JobOutcome(self.job_id, self.status, rows, self.notes, self.progress)

    def _stamped(self, row: dict[str, Any]) -> dict[str, Any]:
        """An attribution row as attribution.parquet holds it: with its job and the
        confidence level of its intervals, readable alone."""
        return {"job_id": self.job_id, **row, "confidence": self.spec.confidence}

    def aggregate(self) -> list[dict[str, Any]]:
        if self.spec.method == "auto":
            return self._aggregate_held()
        if self.spec.method == "uniform":
            return self._aggregate_flips("uniform")
        z_alpha = self.alpha
        shap = self.shapley.estimates().rows() if self.shapley is not None else {}
        out: list[dict[str, Any]] = []
        for arm in self.arms:
            rows = [r for r in self._arm_rows(arm) if r["flipped"] is not None]
            flips = sum(bool(r["flipped"]) for r in rows)
            n = len(rows)
            lo, hi = confidence_sequence(flips, n, z_alpha) if n else (None, None)
            event = self.steps[arm.step]
            record: dict[str, Any] = {
                "step": arm.step,
                "step_kind": event.type,
                "label": f"{event.provider}:{event.model}"
                if isinstance(event, LlmEvent)
                else event.name,
                "intervention": arm.kind,
                "flip_rate": flips / n if n else None,
                "flip_lo": lo,
                "flip_hi": hi,
                "flip_n": n,
                "phi": None,
                "phi_lo": None,
                "phi_hi": None,
                "phi_se": None,
                "necessity": None,
                "necessity_lo": None,
                "necessity_hi": None,
                "necessity_n": 0,
                "sufficiency": None,
                "sufficiency_lo": None,
                "sufficiency_hi": None,
                "sufficiency_n": 0,
                "rank": None,
            }
            if arm.kind == "resample" and arm.step in shap:
                record.update({k: v for k, v in shap[arm.step].items() if k != "phi_n"})
            out.append(record)
        for kind in {r["intervention"] for r in out}:
            # Only what was measured is ranked: an arm without a fork has no place.
            ranked = sorted(
                (
                    r
                    for r in out
                    if r["intervention"] == kind and (r["phi"] is not None or r["flip_n"])
                ),
                key=lambda r: (
                    -(r["phi"] if r["phi"] is not None else float("-inf")),
                    -(r["flip_rate"] or 0.0),
                ),
            )
            for i, r in enumerate(ranked, start=1):
                r["rank"] = i
        return sorted(out, key=_table_order)

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


def _observe(shap: SeedShapley, seed: int, coalition: frozenset[int], row: dict[str, Any]) -> None:
    scored = row["outcome"] is not None
    shap.observe(seed, coalition, row["flipped"] if scored else None, row["first_deviation"])


def _ignore(row: dict[str, Any]) -> None:
    return None


def _interval(name: str, e: Interval) -> dict[str, Any]:
    return {name: e.value, f"{name}_lo": e.low, f"{name}_hi": e.high, f"{name}_n": e.n}


def _rank(records: list[dict[str, Any]], key: str) -> None:
    """Rank measured records by `key` within each intervention kind (1 = first); records
    without a value get no rank."""
    for kind in {r["intervention"] for r in records}:
        measured = [r for r in records if r["intervention"] == kind and r[key] is not None]
        measured.sort(key=lambda r: (-r[key], r["step"]))
        for i, r in enumerate(measured, start=1):
            r["rank"] = i


def _table_order(r: dict[str, Any]) -> tuple[bool, str, int, int]:
    """Re-drawn steps first (the steps to fix, by blame), then each other kind; by rank."""
    rank = r["rank"] if r["rank"] is not None else 1 << 30
    return (r["intervention"] != "resample", r["intervention"], rank, r["step"])


def _rate(rows: list[dict[str, Any]]) -> float:
    known = [r for r in rows if r["flipped"] is not None]
    return sum(bool(r["flipped"]) for r in known) / len(known) if known else 0.0


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


def _arm_key(stage: str, spec: ForkSpec) -> str:
    """The arm a fork belongs to, from its spec alone (so resumed rows find their arm)."""
    if stage == "shapley":
        return ",".join(map(str, sorted(spec.interventions)))
    if stage == "controls":
        if not spec.interventions:
            return "held" if spec.tail == "held" else "pinned"
        return "base"
    if stage == "screen" and spec.tail == "held":
        return "block"
    ((step, iv),) = spec.interventions.items()
    return f"{iv.kind}@{step}"


def _leader_text(races: dict[str, Race[str]]) -> str:
    parts = []
    for kind, race in races.items():
        leader = race.leader()
        if leader is not None:
            lo, hi = race.interval(leader)
            parts.append(f"{kind}: {leader} [{lo:.2f}, {hi:.2f}]")
    return "; ".join(parts)
