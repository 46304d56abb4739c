"""Recording, replaying and forking agent runs: `record`, `ForkSpec`, `ForkRunner`."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from .._canon import canonical_bytes, digest_of
from .._usercode import UserCodeError
from ..providers import PriceTable
from ..tape import LlmEvent, Tape, TapeHeader, TapeWriter, ToolError, ToolEvent, load_tape
from ._context import AgentContext
from ._current import running
from ._decisions import ACTIONS, Decisions
from ._divergence import DivergenceError
from ._interventions import EditContext, ForceAction, Intervention, ReplaceObservation
from ._run import (
    BudgetCut,
    EffectBlocked,
    ForkAborted,
    InterventionError,
    Plan,
    ProviderFailed,
    Run,
    SpendLimit,
    Tail,
    UnreadableCall,
    drawn_at,
    explicit_conversation,
    first_deviation,
    recorded_responses,
    recorded_trajectory,
)
from ._shared import SharedDraws
from ._tripwire import quiet_telemetry, tripwire
from ._upstream import AiohttpUpstream, Upstream

log = structlog.get_logger("car_ray.fork")

AgentFn = Callable[[AgentContext], Any]
ScorerFn = Callable[[Any, list[dict[str, Any]]], float]
# Scored: ok, blocked_effect, agent_error (what the agent did under the intervention). Not
# scored: divergence, budget_cut (no whole run), provider_error (the provider failed, not the
# agent: retried as a new attempt), error (the fork could not run, or its scorer failed).
Status = Literal[
    "ok", "divergence", "blocked_effect", "budget_cut", "agent_error", "provider_error", "error"
]


class ForkSpec(BaseModel):
    """A fork, as data: which tape, what to change at which steps, how the tail runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tape_id: str
    interventions: dict[int, Intervention] = Field(default_factory=dict)
    tail: Tail = "live"
    seed: int = 0
    # None: the provider couples draws (a held step met at a changed request is answered with
    # the recorded draw's seed). Else the provider cannot, and such a step draws afresh,
    # except the steps given here, which chose at their recorded request: each with the share
    # of its draws there that made the recorded decision and the draws a changed request gets
    # (`Run._coupled`). How the fork runs, not which fork it is: the task id leaves it out
    # (a resumed job finds the fork whatever its estimate was then).
    couple: dict[int, tuple[float, int]] | None = None

    @field_validator("couple")
    @classmethod
    def _shares(
        cls, value: dict[int, tuple[float, int]] | None
    ) -> dict[int, tuple[float, int]] | None:
        bad = [
            k
            for k, (share, draws) in (value or {}).items()
            if k < 0 or not 0 < share <= 1 or draws < 1
        ]
        if bad:
            raise ValueError(f"couple: steps {bad} need a share in (0, 1] and at least one draw")
        return value

    @field_validator("interventions")
    @classmethod
    def _steps_non_negative(cls, value: dict[int, Intervention]) -> dict[int, Intervention]:
        bad = [k for k in value if k < 0]
        if bad:
            raise ValueError(f"step numbers start at 0; got {bad}")
        return value

    @property
    def task_id(self) -> str:
        """The hash of the spec: the same fork has the same id wherever it runs."""
        return digest_of(self.model_dump(mode="json", exclude={"couple"}))[:32]


@dataclass(frozen=True)
class IntBits:
    """An integer field's width in the row tables (`Int32`: an Arrow int32 column; a plain
    `int` is int64)."""

    bits: int


Int32 = Annotated[int, IntBits(32)]


class ForkRow(BaseModel):
    """One fork's result: what happened, what it cost, and whether the outcome flipped. The
    fork row tables (`car_ray.results.ForkRecord`, the Parquet schema) derive from it."""

    task_id: str
    tape_id: str
    status: Status
    outcome: float | None
    recorded_outcome: float
    flipped: bool | None
    steps_intervened: list[Int32]
    interventions: list[str]
    tail: Tail
    seed: int
    tail_calls: int
    retries: int
    tokens_in: int
    tokens_out: int
    cost_usd: float
    latency_s: float
    divergence: str | None = None
    blocked_effect: str | None = None
    error: str | None = None
    # The first step where the fork did something other than the tape (None: it reproduced
    # the tape), and how many of its calls drew fresh randomness.
    first_deviation: Int32 | None = None
    fresh_draws: int = 0
    # A provider_error's final HTTP status (None: a timeout or a broken connection).
    provider_status: Int32 | None = None
    # A `Reask` fork: whether the provider answered the re-asked request word for word as
    # the tape has it (None: the fork re-asked nothing).
    reproduced: bool | None = None
    # The action (JSON) the model answered at the first deviation, where that step is a
    # model call (None otherwise): what a later fork of the seed forces there to draw as
    # this one did (`replay.drawn_at`).
    drawn: str | None = None


@dataclass
class RunResult:
    """A finished run: the agent's result or error, the trajectory and what was spent."""

    result: Any
    error: BaseException | None
    run: Run
    latency_s: float
    trajectory: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class BaseUrls:
    openai: str
    anthropic: str

    def as_dict(self) -> dict[str, str]:
        return {"openai": self.openai, "anthropic": self.anthropic}

    @classmethod
    def recorded_in(cls, tape: Tape) -> BaseUrls:
        """The base URLs the tape was recorded with: a replay asks for the same paths (and
        never connects, so the host does not matter)."""
        fallback = cls.for_server("http://127.0.0.1:9")
        urls = tape.header.provider
        return cls(
            openai=urls.get("openai", fallback.openai),
            anthropic=urls.get("anthropic", fallback.anthropic),
        )

    @classmethod
    def for_server(cls, url: str) -> BaseUrls:
        """The base URLs the SDKs want for one server speaking both protocols."""
        url = url.rstrip("/")
        return cls(openai=url + "/v1", anthropic=url)


def is_bad(outcome: float) -> bool:
    """Outcomes are in [0, 1], 1 the bad outcome; a flip crosses one half."""
    return outcome >= 0.5


def score_run(scorer: ScorerFn, result: Any, trajectory: list[dict[str, Any]]) -> float:
    """The scorer's value for one run, in [0, 1]; a `UserCodeError` naming the scorer's file
    and line when it raises or returns anything else."""
    try:
        value = float(scorer(result, trajectory))
    except Exception as exc:
        raise UserCodeError.of("scorer", scorer, exc) from exc
    if not 0.0 <= value <= 1.0:  # NaN too: every comparison with it is False
        bad = ValueError(f"the scorer returned {value}; outcomes must lie in [0, 1]")
        raise UserCodeError.of("scorer", scorer, bad)
    return value


class _Engine:
    """Runs agent functions on one event loop; sync agents go to a thread pool."""

    def __init__(
        self,
        agent: AgentFn,
        *,
        upstream: Upstream | None,
        base_urls: BaseUrls,
        prices: PriceTable | None,
        api_keys: Mapping[str, str] | None,
        max_threads: int,
    ) -> None:
        self.agent = agent
        self.upstream = upstream
        self.base_urls = base_urls
        self.prices = prices or PriceTable.load()
        self.api_keys = dict(api_keys or {})
        self._threads = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="agent")
        self._is_async = inspect.iscoroutinefunction(agent)

    async def execute(self, run: Run, input: Any) -> RunResult:
        ctx = AgentContext(run, input, self.base_urls.as_dict(), self.api_keys)
        started = time.perf_counter()
        result: Any = None
        error: BaseException | None = None
        try:
            with running(ctx):
                if self._is_async:
                    result = await self.agent(ctx)
                else:
                    # The agent's thread sees this run as current (`car_ray.tool`).
                    context = contextvars.copy_context()
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(self._threads, context.run, self.agent, ctx)
        except _CONTROL as exc:
            error = exc
        except BaseExceptionGroup as group:
            # A task group (anyio's, asyncio's) wraps what its tasks raised: car-ray's own
            # stop (an effect blocked, a divergence, ...) is the run's end, whatever wraps it.
            error = _control_in(group) or group
            if not isinstance(error, (Exception, *_CONTROL)):
                raise
        except Exception as exc:
            error = exc
        return RunResult(result, error, run, time.perf_counter() - started, run.trajectory)

    async def aclose(self, *, upstream: bool = True) -> None:
        """Stop the agent threads and, unless the caller owns it, close the upstream."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        if upstream and self.upstream is not None:
            await self.upstream.aclose()


async def record(
    agent: AgentFn,
    agent_ref: str,
    input: Any,
    path: Path,
    *,
    base_urls: BaseUrls,
    upstream: Upstream | None = None,
    seed: int | None = None,
    api_keys: Mapping[str, str] | None = None,
    overwrite: bool = False,
) -> tuple[Tape, RunResult]:
    """Run the agent live and write its tape, event by event; returns the sealed tape."""
    header = recording_header(agent_ref, input, base_urls, seed)
    writer = TapeWriter(path, header, overwrite=overwrite)
    owned = upstream is None
    engine = _Engine(
        agent,
        upstream=upstream or AiohttpUpstream(),
        base_urls=base_urls,
        prices=None,
        api_keys=api_keys,
        max_threads=1,
    )
    run = Run(
        loop=asyncio.get_running_loop(),
        upstream=engine.upstream,
        writer=writer,
        seed=header.seed or 0,
        base_urls=base_urls.as_dict(),
    )
    try:
        with tripwire() as tripped:
            outcome = await engine.execute(run, input)
            around = tripped.calls
    finally:
        await engine.aclose(upstream=owned)
    if around and run.unreadable is None:
        run.unreadable = f"{around[0]} went around car-ray's transport ({len(around)} such calls)"
    if run.unreadable is None:
        seal_recording(writer, outcome.result, outcome.error)
    else:
        # Whatever the agent made of it, the run is not one car-ray can read: sealed so.
        seal_recording(writer, None, UnreadableCall(run.unreadable))
        raise RecordingRefused(
            f"{path}: {run.unreadable}; the recording stopped there (the tape keeps the steps "
            "before it, sealed with the error). Make the call through a client car-ray "
            "records: ctx.openai() / ctx.async_openai() / ctx.anthropic(), or pass "
            "http_client=ctx.http_client and base_url=ctx.base_url(...) to your own"
        )
    return load_tape(path), outcome


class RecordingRefused(ValueError):
    """A recording that made a call car-ray cannot read as a model step; names the step, the
    call and what to do."""


def recording_header(
    agent_ref: str, input: Any, base_urls: BaseUrls, seed: int | None = None
) -> TapeHeader:
    """The first line of a tape about to be recorded; without a seed, one from the clock."""
    # The seed is always written: a fork re-answers a held step whose request changed with
    # the recorded draw's randomness, which it derives from this seed.
    return TapeHeader(
        agent=agent_ref,
        input=input,
        provider=base_urls.as_dict(),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        seed=seed if seed is not None else time.time_ns() % (1 << 62),
    )


def seal_recording(writer: TapeWriter, result: Any, error: BaseException | None) -> str:
    """Seal a recorded run with the agent's result, or the error it raised (its type and
    message); returns the tape id."""
    raised = ToolError(type=type(error).__name__, message=str(error)) if error else None
    return writer.seal(result, raised)


# What car-ray raises into an agent to end its run (each a BaseException).
_CONTROL = (EffectBlocked, ForkAborted, BudgetCut, ProviderFailed, UnreadableCall)


def _control_in(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The first of car-ray's own stops (`_CONTROL`) in an exception group, however nested."""
    for exc in group.exceptions:
        if isinstance(exc, _CONTROL):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            found = _control_in(exc)
            if found is not None:
                return found
    return None


class ForkRunner:
    """Runs replays and forks of cached tapes, many at once, on the current event loop.

    Tapes are loaded once and kept by id; each fork is a coroutine with no process or
    thread of its own (a sync agent borrows a pool thread while it runs)."""

    def __init__(
        self,
        agent: AgentFn,
        scorer: ScorerFn,
        *,
        base_urls: BaseUrls,
        upstream: Upstream | None = None,
        prices: PriceTable | None = None,
        api_keys: Mapping[str, str] | None = None,
        max_threads: int = 256,
        decisions: Decisions = ACTIONS,
    ) -> None:
        quiet_telemetry()  # forks run the agent: none of them is traced off the machine
        self.scorer = scorer
        # What counts as a step's decision when a fork is compared with its tape.
        self.decisions = decisions
        self._engine = _Engine(
            agent,
            upstream=upstream,
            base_urls=base_urls,
            prices=prices,
            api_keys=api_keys,
            max_threads=max_threads,
        )
        self._tapes: dict[str, Tape] = {}
        self._recorded_outcomes: dict[str, float] = {}
        # Off the coupled simulator, forks of a seed share their fresh draws.
        self.shared = SharedDraws()

    def add_tape(self, tape: Tape) -> str:
        tape.require_sealed()
        self._tapes[tape.tape_id] = tape
        return tape.tape_id

    def tape(self, tape_id: str) -> Tape:
        try:
            return self._tapes[tape_id]
        except KeyError:
            raise KeyError(f"tape {tape_id} is not loaded in this runner") from None

    def recorded_outcome(self, tape_id: str) -> float:
        if tape_id not in self._recorded_outcomes:
            tape = self.tape(tape_id)
            assert tape.seal is not None
            self._recorded_outcomes[tape_id] = self._score(
                tape.seal.result, recorded_trajectory(tape)
            )
        return self._recorded_outcomes[tape_id]

    def _score(self, result: Any, trajectory: list[dict[str, Any]]) -> float:
        return score_run(self.scorer, result, trajectory)

    def check(self, spec: ForkSpec) -> None:
        """Refuse a spec that names steps the tape does not have or misfits a step's kind."""
        steps = self.tape(spec.tape_id).steps
        for k, iv in spec.interventions.items():
            if k >= len(steps):
                raise InterventionError(
                    f"step {k} does not exist: the tape has steps 0..{len(steps) - 1}"
                )
            event = steps[k]
            if isinstance(iv, ReplaceObservation) and not isinstance(event, ToolEvent):
                raise InterventionError(
                    f"step {k} is a model call: 'observation' needs a tool step"
                )
            if isinstance(iv, ForceAction | EditContext) and not isinstance(event, LlmEvent):
                raise InterventionError(
                    f"step {k} is tool {event.name!r}: '{iv.kind}' needs a model-call step"
                )
            if (
                isinstance(iv, EditContext)
                and isinstance(event, LlmEvent)
                and isinstance(event.request.body, dict)
            ):
                # Tried on the recorded request (with the conversation a Responses request
                # continues): an edit that cannot apply is the user's error.
                body = event.request.body
                if body.get("previous_response_id") is not None:
                    body = explicit_conversation(body, recorded_responses(steps))
                try:
                    iv.apply(body)
                except ValueError as exc:
                    raise InterventionError(
                        f"step {k}: {exc} (see it with car-ray inspect TAPE --step {k})"
                    ) from None

    async def replay(self, tape_id: str) -> RunResult:
        """Replay the tape with no network path; a divergence is raised, with its diff."""
        tape = self.tape(tape_id)
        run = Run(
            loop=asyncio.get_running_loop(),
            upstream=None,
            tape=tape,
            plan=Plan(),
            seed=tape.header.seed or 0,
            base_urls=self._engine.base_urls.as_dict(),
        )
        outcome = await self._engine.execute(run, tape.header.input)
        if run.divergence is not None:
            raise run.divergence
        assert tape.seal is not None
        recorded_error = tape.seal.error.type if tape.seal.error else None
        # car-ray's own stops are BaseExceptions: an Exception is the agent's own failure.
        if isinstance(outcome.error, Exception) and type(outcome.error).__name__ != recorded_error:
            raise UserCodeError.of(
                "agent",
                self._engine.agent,
                outcome.error,
                when=f"on the tape's input (after {run.step} of its {len(tape.steps)} steps)",
            )
        if run.step < len(tape.steps):
            raise DivergenceError(
                run.step,
                f"the agent stopped after {run.step} steps; the tape has {len(tape.steps)}",
            )
        observed_error = type(outcome.error).__name__ if outcome.error else None
        if recorded_error != observed_error:
            raise DivergenceError(
                run.step, f"the run ended with {observed_error}; the tape with {recorded_error}"
            )
        if outcome.error is None and canonical_bytes(outcome.result) != canonical_bytes(
            tape.seal.result
        ):
            raise DivergenceError(
                run.step,
                "the agent's result differs from the recorded one "
                "(nondeterminism outside ctx.now / ctx.uuid4 / ctx.random?)",
            )
        return outcome

    def error_row(self, spec: ForkSpec, error: str) -> ForkRow:
        """The row of a fork that could not run at all (nothing was spent)."""
        return ForkRow(
            task_id=spec.task_id,
            tape_id=spec.tape_id,
            status="error",
            outcome=None,
            recorded_outcome=self.recorded_outcome(spec.tape_id),
            flipped=None,
            steps_intervened=sorted(spec.interventions),
            interventions=[spec.interventions[k].kind for k in sorted(spec.interventions)],
            tail=spec.tail,
            seed=spec.seed,
            tail_calls=0,
            retries=0,
            tokens_in=0,
            tokens_out=0,
            cost_usd=0.0,
            latency_s=0.0,
            error=error,
        )

    async def run(self, spec: ForkSpec, limit: SpendLimit | None = None) -> ForkRow:
        """Run one fork and return its row; failures are in the row, not raised."""
        row, _ = await self.fork(spec, limit)
        return row

    async def fork(
        self, spec: ForkSpec, limit: SpendLimit | None = None
    ) -> tuple[ForkRow, list[dict[str, Any]]]:
        """Run one fork: its row and the trajectory the scorer saw. With `limit`, no live
        call is made that could take the fork's spend past it."""
        self.check(spec)
        tape = self.tape(spec.tape_id)
        recorded = self.recorded_outcome(spec.tape_id)
        run = Run(
            loop=asyncio.get_running_loop(),
            upstream=self._engine.upstream,
            tape=tape,
            plan=Plan(dict(spec.interventions), spec.tail, spec.couple),
            seed=spec.seed,
            base_urls=self._engine.base_urls.as_dict(),
            prices=self._engine.prices,
            limit=limit,
            decisions=self.decisions,
            # `couple` is None where the provider couples draws itself.
            shared=self.shared if spec.couple is not None else None,
        )
        outcome = await self._engine.execute(run, tape.header.input)
        status: Status = "ok"
        score: float | None = None
        error: str | None = None
        if run.provider_failure is not None:
            # The agent may have seen the failure and gone on: whatever it did then is not
            # its answer to the intervention.
            status = "provider_error"
            error = f"provider failed at {run.provider_failure}"
        elif run.divergence is not None:
            status = "divergence"
        elif run.cut:
            # An unfinished run has no outcome: scoring it would bias toward short tails.
            status = "budget_cut"
        else:
            if run.blocked is not None:
                status = "blocked_effect"
            elif outcome.error is not None:
                status = "agent_error"
                error = f"{type(outcome.error).__name__}: {outcome.error}"
            try:
                # A blocked effect or a crash is still scored: the trajectory shows the
                # attempted call, and the job's scorer says whether that is the bad outcome.
                score = self._score(outcome.result, run.trajectory)
            except Exception as exc:
                status = "error"
                error = (error + "; " if error else "") + f"scorer failed: {exc}"
        spend = run.spend
        deviation = first_deviation(run.trajectory, tape, self.decisions)
        row = ForkRow(
            task_id=spec.task_id,
            tape_id=spec.tape_id,
            status=status,
            outcome=score,
            recorded_outcome=recorded,
            flipped=None if score is None else is_bad(score) != is_bad(recorded),
            steps_intervened=sorted(spec.interventions),
            interventions=[spec.interventions[k].kind for k in sorted(spec.interventions)],
            tail=spec.tail,
            seed=spec.seed,
            tail_calls=spend.tail_calls,
            retries=spend.retries,
            tokens_in=spend.tokens_in,
            tokens_out=spend.tokens_out,
            cost_usd=round(spend.cost_usd, 9),
            latency_s=round(outcome.latency_s, 6),
            divergence=run.divergence.summary() if run.divergence else None,
            blocked_effect=run.blocked,
            error=error,
            first_deviation=deviation,
            fresh_draws=run.fresh_draws,
            drawn=drawn_at(run.trajectory, deviation),
            provider_status=run.provider_failure.status if run.provider_failure else None,
            reproduced=run.reproduced,
        )
        return row, run.trajectory

    async def aclose(self) -> None:
        await self._engine.aclose()
