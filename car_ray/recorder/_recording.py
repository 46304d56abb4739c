"""`car_ray.recording(folder)`: every run of an agent function recorded to its own tape, in
production, with no change to the agent beyond the `ctx` it already takes.

The machinery is `car-ray record`'s: the same `Run` behind the same httpx2 transport seam,
the same `TapeWriter` (each line fsynced before the agent sees the answer), the same header
and seal. What is new is only where it runs: in the caller's thread or task, many runs at
once, each with its own tape and a mark beside it (see `_marks`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar, overload

import structlog

from .._canon import line_bytes
from .._imports import import_ref
from .._usercode import UserCodeError
from ..providers import api_keys_from_env
from ..replay import (
    AgentContext,
    BaseUrls,
    Run,
    ScorerFn,
    Upstream,
    is_bad,
    recording_header,
    score_run,
    seal_recording,
)
from ..replay._current import enter_run, leave_run
from ..tape import TapeWriter, ToolError
from ._loop import RECORDING_LOOP, OnLoop
from ._marks import TAPE_SUFFIX, MarkedBy, MarkStatus, RunMark, mark_tape, write_mark

log = structlog.get_logger("car_ray.recording")

R = TypeVar("R")

# What the SDKs themselves use when no base URL is given.
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"


def provider_base_urls() -> BaseUrls:
    """The live providers, as the SDKs find them: OPENAI_BASE_URL / ANTHROPIC_BASE_URL, else
    their public APIs."""
    return BaseUrls(
        openai=os.environ.get("OPENAI_BASE_URL") or OPENAI_BASE_URL,
        anthropic=os.environ.get("ANTHROPIC_BASE_URL") or ANTHROPIC_BASE_URL,
    )


def agent_ref_of(fn: Callable[..., Any]) -> str:
    """`module:qualname`, the reference a job file gives for the same function."""
    return f"{fn.__module__}:{fn.__qualname__}"


def _tape_name(started: datetime) -> str:
    """Time first (names sort as runs started), then a random part (runs started in the
    same microsecond, in other threads or processes, never share a name)."""
    return f"{started:%Y%m%dT%H%M%S-%f}Z-{secrets.token_hex(4)}{TAPE_SUFFIX}"


def _not_json(value: Any) -> str | None:
    try:
        line_bytes(value)
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


class RecordedRun:
    """One recorded run: its tape (`path`), the `ctx` the agent takes, and once it has
    ended its `result` or `error`, its tape id and its `mark`.

    In a `with car_ray.recording(...)` block, give the agent `run.ctx` and set `run.result`
    to what it returned (a replay compares its own result with it)."""

    def __init__(
        self,
        recording: Recording,
        *,
        agent_ref: str,
        input: Any,
        seed: int | None,
        loop: asyncio.AbstractEventLoop,
        upstream: Upstream,
    ) -> None:
        self._recording = recording
        self.agent_ref = agent_ref
        self.started = datetime.now(UTC)
        header = recording_header(agent_ref, input, recording.base_urls, seed)
        problem = _not_json(input)
        if problem is not None:
            raise TypeError(
                f"car_ray.recording: the input of {agent_ref} must be a JSON value to be "
                f"recorded ({problem}); pass ids and plain data"
            )
        self._writer = self._open(header)
        self.path = self._writer.path
        self._run = Run(
            loop=loop,
            upstream=upstream,
            writer=self._writer,
            seed=header.seed or 0,
            base_urls=recording.base_urls.as_dict(),
        )
        self.ctx = AgentContext(self._run, input, recording.base_urls.as_dict(), recording.keys())
        self.result: Any = None
        self.error: BaseException | None = None
        self.tape_id: str | None = None
        self.mark: RunMark | None = None
        self._caller: tuple[bool, str | None] | None = None

    def _open(self, header: Any) -> TapeWriter:
        folder = self._recording.folder
        for _ in range(3):
            try:
                return TapeWriter(
                    folder / _tape_name(self.started), header, fsync=self._recording.fsync
                )
            except FileExistsError:  # the same name twice: draw another
                continue
        raise FileExistsError(f"{folder}: could not find a free tape name in 3 tries")

    @property
    def ended(self) -> bool:
        return self.tape_id is not None

    def mark_failed(self, reason: str) -> None:
        """Mark this run failed (`failing_tapes` will list it), before or after it ends;
        the caller's mark replaces the scorer's."""
        self._set_mark(True, reason)

    def mark_passed(self, reason: str | None = None) -> None:
        """Mark this run passed: it is left out of `failing_tapes`, whatever the scorer said."""
        self._set_mark(False, reason)

    def _set_mark(self, failed: bool, reason: str | None) -> None:
        if not self.ended:
            self._caller = (failed, reason)
            return
        self.mark = mark_tape(self.path, failed=failed, reason=reason)

    def _finish(self, result: Any, error: BaseException | None) -> RunMark:
        """Seal the tape with the result or error, score the run and write its mark."""
        self.result, self.error = result, error
        self.tape_id = seal_recording(self._writer, result, error)
        status, by, score, reason = self._judge(result, error)
        self.mark = RunMark(
            tape=self.path.name,
            tape_id=self.tape_id,
            agent=self.agent_ref,
            started=self.started,
            status=status,
            score=score,
            reason=reason,
            marked_by=by,
            error=ToolError(type=type(error).__name__, message=str(error)) if error else None,
        )
        write_mark(self.path.parent, self.mark, fsync=self._recording.fsync)
        return self.mark

    def _judge(
        self, result: Any, error: BaseException | None
    ) -> tuple[MarkStatus, MarkedBy | None, float | None, str | None]:
        if error is not None and not isinstance(error, Exception):
            # Cancelled or interrupted: the run was stopped, it did not fail.
            return "aborted", None, None, f"the run was stopped ({type(error).__name__})"
        if error is not None:
            if self._caller is not None:
                failed, why = self._caller
                return ("failed" if failed else "passed"), "caller", None, why
            return "failed", "error", None, f"the agent raised {type(error).__name__}: {error}"
        problem = _not_json(result)
        score: float | None = None
        scorer = self._recording.scorer_fn()
        scorer_said: str | None = None
        if problem is not None:
            scorer_said = (
                f"the agent returned a value that is not JSON ({problem}): its tape cannot be "
                "replayed; return plain data"
            )
        elif scorer is not None:
            trajectory = [
                {**entry, "source": "recorded"}
                for entry in sorted(self._run.trajectory, key=lambda e: int(e["step"]))
            ]
            try:
                score = score_run(scorer, result, trajectory)
            except UserCodeError as exc:
                scorer_said = f"the scorer failed: {exc}"
                log.warning("scorer_failed", tape=self.path.name, error=str(exc))
        if self._caller is not None:
            failed, why = self._caller
            return ("failed" if failed else "passed"), "caller", score, why
        if score is None:
            return "unscored", None, None, scorer_said
        return ("failed" if is_bad(score) else "passed"), "scorer", score, None


class SyncRecordedAgent(Protocol[R]):
    """A sync agent under `car_ray.recording`: call it with the input to record a run (the
    agent's result comes back), or with an `AgentContext` to run it plain (replays, forks)."""

    __wrapped__: Callable[[AgentContext], R]

    def __call__(self, input: Any, /) -> R: ...

    def record(self, input: Any, /, *, seed: int | None = None) -> RecordedRun:
        """Record one run and return it (`result`, `path`, `mark`, `mark_failed`); what the
        agent raises is raised, with a note naming the tape."""
        ...


class AsyncRecordedAgent(Protocol[R]):
    """An async agent under `car_ray.recording` (see `SyncRecordedAgent`)."""

    __wrapped__: Callable[[AgentContext], Awaitable[R]]

    def __call__(self, input: Any, /) -> Awaitable[R]: ...

    def record(self, input: Any, /, *, seed: int | None = None) -> Awaitable[RecordedRun]: ...


class Recording:
    """Records runs to `folder`: as a decorator on an agent function, or as a context
    manager (sync or async) around one run. Made by `car_ray.recording`."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        scorer: ScorerFn | str | None,
        agent: Callable[..., Any] | str | None,
        input: Any,
        seed: int | None,
        base_urls: BaseUrls | None,
        api_keys: Mapping[str, str] | None,
        fsync: bool,
    ) -> None:
        if isinstance(folder, str) and "://" in folder:
            raise ValueError(
                f"car_ray.recording({folder!r}): tapes are recorded to a local folder (each "
                "line is fsynced as the run goes); copy the folder to object storage "
                "afterwards, e.g. with `aws s3 sync`"
            )
        self.folder = Path(folder)
        self.scorer = scorer
        self.agent = agent_ref_of(agent) if callable(agent) else agent
        self.input = input
        self.seed = seed
        self.base_urls = base_urls or provider_base_urls()
        self.api_keys = dict(api_keys) if api_keys is not None else None
        self.fsync = fsync
        self._scorer_fn: ScorerFn | None = None
        self._open: ContextVar[tuple[RunScope, ...]] = ContextVar("car_ray_recording_open")

    def keys(self) -> dict[str, str]:
        """The API keys for this run: as given, else from the environment (read per run, so
        a rotated key is picked up)."""
        return dict(self.api_keys) if self.api_keys is not None else api_keys_from_env()

    def scorer_fn(self) -> ScorerFn | None:
        if isinstance(self.scorer, str) and self._scorer_fn is None:
            self._scorer_fn = import_ref(self.scorer, "scorer")
        return self._scorer_fn if isinstance(self.scorer, str) else self.scorer

    # -- the decorator ---------------------------------------------------------------

    # An async agent is also a callable returning something: the first match wins.
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[[AgentContext], Awaitable[R]]
    ) -> AsyncRecordedAgent[R]: ...

    @overload
    def __call__(self, fn: Callable[[AgentContext], R]) -> SyncRecordedAgent[R]: ...

    def __call__(self, fn: Callable[[AgentContext], Any]) -> Any:
        if self.input is not None:
            raise TypeError(
                "car_ray.recording(..., input=...) is for the context manager; a decorated "
                "agent is called with its input"
            )
        ref = self.agent or agent_ref_of(fn)
        if inspect.iscoroutinefunction(fn):
            return self._wrap_async(fn, ref)
        return self._wrap_sync(fn, ref)

    def _wrap_sync(self, fn: Callable[[AgentContext], Any], ref: str) -> Any:
        def record(input: Any, /, *, seed: int | None = None) -> RecordedRun:
            with RunScope(self, ref, input, seed) as run:
                run.result = fn(run.ctx)
            return run

        @functools.wraps(fn)
        def agent(arg: Any, /) -> Any:
            if isinstance(arg, AgentContext):  # car-ray itself runs it: replay, fork
                return fn(arg)
            return record(arg).result

        agent.record = record  # type: ignore[attr-defined]
        return agent

    def _wrap_async(self, fn: Callable[[AgentContext], Awaitable[Any]], ref: str) -> Any:
        async def record(input: Any, /, *, seed: int | None = None) -> RecordedRun:
            async with RunScope(self, ref, input, seed) as run:
                run.result = await fn(run.ctx)
            return run

        @functools.wraps(fn)
        async def agent(arg: Any, /) -> Any:
            if isinstance(arg, AgentContext):
                return await fn(arg)
            return (await record(arg)).result

        agent.record = record  # type: ignore[attr-defined]
        return agent

    # -- the context manager ---------------------------------------------------------

    def _scope(self) -> RunScope:
        if self.agent is None:
            raise TypeError(
                "car_ray.recording(folder, agent=..., input=...): name the agent (the "
                "function, or 'module:function') so the tape says which agent ran"
            )
        scope = RunScope(self, self.agent, self.input, None)
        self._open.set((*self._open.get(()), scope))
        return scope

    def _pop(self) -> RunScope:
        *rest, scope = self._open.get()
        self._open.set(tuple(rest))
        return scope

    def __enter__(self) -> RecordedRun:
        return self._scope().__enter__()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pop().__exit__(exc_type, exc, tb)

    async def __aenter__(self) -> RecordedRun:
        return await self._scope().__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pop().__exit__(exc_type, exc, tb)


class RunScope:
    """One recorded run as a with-block: entering opens its tape; leaving seals it with
    `run.result`, or with what the block raised (which goes on, with a note naming the
    tape), then scores and marks it. Sync: model calls go through the recording loop;
    async: the run lives on the running loop."""

    def __init__(self, recording: Recording, ref: str, input: Any, seed: int | None) -> None:
        self.recording = recording
        self.ref = ref
        self.input = input
        self.seed = seed if seed is not None else recording.seed
        self.run: RecordedRun | None = None
        self._current: Token[AgentContext | None] | None = None  # `car_ray.tool`

    def _open(self, loop: asyncio.AbstractEventLoop, upstream: Upstream) -> RecordedRun:
        self.run = RecordedRun(
            self.recording,
            agent_ref=self.ref,
            input=self.input,
            seed=self.seed,
            loop=loop,
            upstream=upstream,
        )
        self._current = enter_run(self.run.ctx)
        return self.run

    def __enter__(self) -> RecordedRun:
        return self._open(*RECORDING_LOOP.get())

    async def __aenter__(self) -> RecordedRun:
        recording_loop, upstream = RECORDING_LOOP.get()
        return self._open(asyncio.get_running_loop(), OnLoop(upstream, recording_loop))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        run = self.run
        assert run is not None
        if self._current is not None:
            leave_run(self._current)
            self._current = None
        if exc is None:
            run._finish(run.result, None)
            return
        run._finish(None, exc)
        status = run.mark.status if run.mark else "unmarked"
        exc.add_note(f"car-ray recorded this run to {run.path} (marked {status})")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def recording(
    folder: str | os.PathLike[str],
    *,
    scorer: ScorerFn | str | None = None,
    agent: Callable[..., Any] | str | None = None,
    input: Any = None,
    seed: int | None = None,
    base_urls: BaseUrls | None = None,
    api_keys: Mapping[str, str] | None = None,
    fsync: bool = True,
) -> Recording:
    """Record each run of an agent to its own tape in `folder`, with a mark beside it.

    As a decorator: `@car_ray.recording("traces/", scorer=my_scorer)` on `def agent(ctx)`
    (or `async def`); call `agent(input)` and the run is recorded; `agent(ctx)` with car-ray's
    own context (a replay, a fork) runs it plain. As a context manager:
    `with car_ray.recording("traces/", agent=agent, input=x) as run:` then `agent(run.ctx)`.

    `scorer(result, trajectory) -> float` in [0, 1] (the job's scorer) marks a run failed at
    0.5 or more; without one a run is unscored unless its caller marks it
    (`run.mark_failed(reason)`, `car_ray.mark_tape(path, failed=True)`). A run that raises
    is marked failed (cancelled or interrupted: aborted). `base_urls` default to the
    providers' (OPENAI_BASE_URL / ANTHROPIC_BASE_URL), `api_keys` to OPENAI_API_KEY /
    ANTHROPIC_API_KEY; keys never reach a tape. `seed` fixes the seed every run is recorded
    with (tests, simulated providers); by default each run draws its own.

    Each line of a tape is fsynced before the agent goes on, as `car-ray record` does;
    `fsync=False` leaves flushing to the OS (a killed process still leaves whole lines; a
    power loss may cost a tape its last lines) and saves a disk wait per step
    (benchmarks/recording_overhead.py)."""
    return Recording(
        folder,
        scorer=scorer,
        agent=agent,
        input=input,
        seed=seed,
        base_urls=base_urls,
        api_keys=api_keys,
        fsync=fsync,
    )
