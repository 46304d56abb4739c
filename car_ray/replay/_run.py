"""One execution of an agent against a tape: recording, faithful replay, or a fork.

Every model call and tool call of the agent arrives here as a step; `Run` decides, step by
step, whether to serve it from the tape (checking the request), apply an intervention, or
go live, and keeps the trajectory the scorer sees.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import hashlib
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeGuard
from urllib.parse import urlsplit

import aiohttp
import httpx2
import structlog
from pydantic import BaseModel, ConfigDict

from .._canon import canonical_bytes, digest_of, json_roundtrip, sha256_hex
from ..providers import (
    OPENAI,
    READS,
    RESPONSES,
    SEED_HEADER,
    Action,
    PriceTable,
    Usage,
    as_input_items,
    as_items,
    codec_for_path,
    estimate_usage,
    response_of,
    seeded_body,
)
from ..tape import LlmEvent, Tape, TapeWriter, ToolError, ToolEvent
from ._coupling import keep_chances
from ._decisions import ACTIONS, Decisions
from ._divergence import DivergenceError, json_diff
from ._interventions import (
    EditContext,
    ForceAction,
    Intervention,
    Probe,
    Reask,
    ReplaceObservation,
    Resample,
    SeedDraw,
    SwapPolicy,
)
from ._shared import SharedDraws, draw_key
from ._upstream import Upstream, WireRequest, WireResponse

log = structlog.get_logger("car_ray.replay")

# Allowlists, not blocklists: nothing else of a request or response reaches a tape, so
# API keys and auth headers (authorization, x-api-key, cookies, ...) never do.
TAPE_REQUEST_HEADERS = frozenset({"content-type", "accept", "anthropic-version", "anthropic-beta"})
TAPE_RESPONSE_HEADERS = frozenset({"content-type", "request-id", "x-request-id"})
NEVER = 1 << 62

Tail = Literal["live", "pinned", "held"]
Source = Literal[
    "recorded", "replay", "live", "forced", "pinned", "held", "rederived", "coupled", "blocked"
]


class EffectBlocked(BaseException):
    """Raised into the agent when a fork would run an effectful tool: the fork ends here.

    A BaseException so that an agent's `except Exception` cannot swallow it."""


class UnreadableCall(BaseException):
    """Raised into the agent when, recording, it makes a call car-ray cannot read as a model
    step (an endpoint it does not know, or an answer it cannot parse): the recording ends
    there, never with a step that "answered nothing". A BaseException so that an agent's
    `except Exception` cannot swallow it."""


class ForkAborted(BaseException):
    """Raised into the agent after a divergence, so a fork cannot go on off the tape."""


class ProviderFailed(BaseException):
    """Raised into the agent when a fork's live call ends, after its retries, in a provider
    failure (429, 408, 409, 5xx, a timeout or a broken connection): the fork has no outcome,
    it is not the agent's doing. A BaseException so that an agent's `except Exception`
    cannot turn an outage into an outcome."""

    def __init__(self, step: int, status: int | None, message: str) -> None:
        self.step = step
        self.status = status
        self.message = message
        super().__init__(f"step {step}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (a Ray worker) whole
        return (type(self), (self.step, self.status, self.message), self.__dict__)


# Final answers that are the provider's failure, not the model's: the retry policy's
# statuses and every 5xx.
PROVIDER_FAILURE_STATUSES = frozenset({408, 409, 429})


def is_provider_failure(status: int) -> bool:
    return status in PROVIDER_FAILURE_STATUSES or status >= 500


class ToolFailed(Exception):
    """A recorded tool error, served again during replay when its type is not a builtin."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(f"{type_name}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (a Ray worker) whole
        return (type(self), (self.type_name, self.message), self.__dict__)


class InterventionError(ValueError):
    """An intervention that does not fit the step it names."""


def step_seed(seed: int, step: int) -> int:
    """The seed of one recorded draw: fixed by the recording's seed and the step. A held
    step whose request changed is answered again with this seed (the recorded draw's
    randomness, where the provider honours seeds)."""
    return int(hashlib.sha256(f"{seed}:{step}".encode()).hexdigest()[:15], 16)


def coupling_seed(seed: int, step: int, draw: int) -> int:
    """The seed of a coupled step's draw `draw` in a fork (`Run._coupled`), and of its choice
    (`draw` -1): fixed by the fork's seed, apart from `fresh_seed`'s domain."""
    return int(hashlib.sha256(f"couple/{seed}:{step}:{draw}".encode()).hexdigest()[:15], 16)


def fresh_seed(seed: int, step: int) -> int:
    """The seed of one fresh draw in a fork: fixed by the fork's seed and the step (so a
    rerun of the same task draws the same way), and never a recording's seed for that step
    (a separate hash domain)."""
    return int(hashlib.sha256(f"fork/{seed}:{step}".encode()).hexdigest()[:15], 16)


@dataclass(frozen=True)
class Plan:
    """What a run does: interventions by step and what happens after the first of them."""

    interventions: dict[int, Intervention] = field(default_factory=dict)
    tail: Tail = "live"
    # None: the provider couples draws. Else a held step met at a changed request draws
    # afresh, or, for a step given here, keeps its decision as a maximal coupling would:
    # step -> (share of its recorded-request draws that made it, draws to make).
    couple: dict[int, tuple[float, int]] | None = None

    @property
    def first(self) -> int:
        return min(self.interventions, default=NEVER)


@dataclass
class Spend:
    tail_calls: int = 0
    retries: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0


class SpendLimit(BaseModel):
    """A fork's hard ceiling (its budget reservation): a live call that could cross it is
    not made, and the fork ends as `budget_cut`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd: float | None = None
    tokens: int | None = None
    # The output a call without max_tokens is assumed to stay under (the same number the
    # reservation was made with).
    default_output_tokens: int = 1024
    # Input tokens per byte of request JSON the reservation was sized with (call_bound).
    tokens_per_byte: float = 1 / 3


class BudgetCut(BaseException):
    """Raised into the agent when its next live call could exceed the fork's reservation."""


DEFAULT_MAX_OUTPUT_TOKENS = 1024


def call_bound(
    body: Any,
    prices: PriceTable,
    model: str,
    default_output: int = DEFAULT_MAX_OUTPUT_TOKENS,
    tokens_per_byte: float = 1 / 3,
) -> tuple[int, float]:
    """An upper estimate of one live call's tokens and cost, made before sending it:
    input from the body's size (`tokens_per_byte` of its canonical JSON: fewer than one
    token per 3 bytes for any tokenizer; a job learns its provider's from its tape), output
    from its max_tokens (or `default_output` when the request sets none)."""
    size = len(canonical_bytes(body)) if body is not None else 0
    out = default_output
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if isinstance(body.get(key), int):
                out = body[key]
                break
    usage = Usage(int(size * tokens_per_byte) + 1, out)
    return usage.input_tokens + usage.output_tokens, prices.cost_usd(model, usage)


def llm_entry(step: int, event_like: dict[str, Any], source: Source) -> dict[str, Any]:
    """A trajectory entry for a model call, as the scorer sees it."""
    return {"step": step, "kind": "llm", "source": source, **event_like}


def tool_entry(step: int, event: ToolEvent, source: Source) -> dict[str, Any]:
    """A trajectory entry for a tool call, as the scorer sees it."""
    return {
        "step": step,
        "kind": "tool",
        "source": source,
        "name": event.name,
        "arguments": event.arguments,
        "effect": event.effect,
        "result": event.result,
        "error": event.error.model_dump() if event.error else None,
        "blocked": source == "blocked",
    }


def recorded_trajectory(tape: Tape) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for event in tape.steps:
        if isinstance(event, LlmEvent):
            out.append(llm_entry(event.step, _llm_fields(event), "recorded"))
        else:
            out.append(tool_entry(event.step, event, "recorded"))
    return out


def recorded_responses(steps: Sequence[Any]) -> dict[str, tuple[Any, list[Any]]]:
    """A tape's Responses answers by their id: the request and the answer's output items."""
    found: dict[str, tuple[Any, list[Any]]] = {}
    for event in steps:
        if not isinstance(event, LlmEvent) or event.response.status != 200:
            continue
        if codec_for_path(event.request.path) is not RESPONSES:
            continue
        try:
            answer = response_of(event.response.body_bytes, event.response.stream)
        except (ValueError, KeyError, TypeError):
            continue
        found[str(answer.get("id"))] = (event.request.body, answer.get("output") or [])
    return found


def explicit_conversation(body: Any, known: Mapping[str, tuple[Any, list[Any]]]) -> Any:
    """A Responses request whose `previous_response_id` is one of `known`'s answers: the
    conversation it continues, given explicitly (each earlier request's input items and its
    answer's output items, back to the first or to an answer not known), with the request's
    own input after it, and no `previous_response_id` (unless the chain ends at an answer not
    known, whose id it keeps)."""
    if not isinstance(body, dict) or body.get("previous_response_id") not in known:
        return body
    previous = body.get("previous_response_id")
    chain: list[tuple[Any, list[Any]]] = []
    while isinstance(previous, str) and previous in known and len(chain) <= len(known):
        request, output = known[previous]
        chain.append((request, output))
        previous = request.get("previous_response_id") if isinstance(request, dict) else None
    items: list[Any] = []
    for request, output in reversed(chain):
        items += as_items(request.get("input") if isinstance(request, dict) else None)
        items += as_input_items(output)
    rest = {k: v for k, v in body.items() if k != "previous_response_id"}
    if previous is not None:
        rest["previous_response_id"] = previous
    return {**rest, "input": items + as_items(body.get("input"))}


def first_deviation(
    trajectory: list[dict[str, Any]], tape: Tape, decisions: Decisions = ACTIONS
) -> int | None:
    """The first step at which a run did something other than the tape (another action, or
    another decision where the job holds decisions; another tool call or result, a step the
    tape does not have, or stopping early); None when it reproduced the tape step for step."""
    found: list[int] = [len(trajectory)] if len(trajectory) < len(tape.steps) else []
    found += [int(entry["step"]) for entry in trajectory if _deviates(entry, tape, decisions)]
    return min(found, default=None)


def drawn_at(trajectory: list[dict[str, Any]], step: int | None) -> str | None:
    """The action a run's model answered at `step` (its first deviation), as canonical JSON;
    "" where the model answered there but its answer could not be read, None where the run
    made no model call there (it ended before, or the step is a tool's)."""
    if step is None:
        return None
    for entry in trajectory:
        if int(entry["step"]) == step:
            if entry["kind"] != "llm":
                return None
            action = entry.get("action")
            return "" if action is None else canonical_bytes(action).decode()
    return None


def _deviates(entry: dict[str, Any], tape: Tape, decisions: Decisions = ACTIONS) -> bool:
    """Whether a trajectory entry differs from its step on the tape."""
    k = int(entry["step"])
    recorded = tape.steps[k] if k < len(tape.steps) else None
    if recorded is None or recorded.type != entry["kind"]:
        return True
    if isinstance(recorded, LlmEvent):
        return not decisions.same(entry.get("action"), recorded.action)
    return bool(
        entry["name"] != recorded.name
        or entry["arguments"] != recorded.arguments
        or entry["result"] != recorded.result
        or entry["error"] != (recorded.error.model_dump() if recorded.error else None)
    )


def _own_id(issued: str, key: str) -> str:
    """An id of car-ray's in place of `issued`: its prefix (`call_`, `toolu_`, ...) and a
    hash of `key`."""
    head = re.match(r"[A-Za-z]+[_-]", issued)
    return (head.group(0) if head else "id_") + sha256_hex(key.encode())[:24]


def _renamed(value: Any, names: dict[str, str]) -> Any:
    """A JSON value with every string that `names` has replaced by its name there."""
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [_renamed(v, names) for v in value]
    if isinstance(value, dict):
        return {key: _renamed(v, names) for key, v in value.items()}
    return value


def _llm_fields(event: LlmEvent) -> dict[str, Any]:
    return {
        "provider": event.provider,
        "model": event.model,
        "status": event.response.status,
        "action": event.action,
    }


def _tool_arguments(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    arguments = {"args": list(args), "kwargs": kwargs}
    try:
        canonical_bytes(arguments)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"tool {name!r}: arguments must be JSON values to be recorded ({exc}); "
            "pass ids and plain data to tools, not objects"
        ) from None
    # Round-trip so tuples compare equal to the lists they load back as.
    loaded: dict[str, Any] = json_roundtrip(arguments)
    return loaded


def model_of(body: Any) -> str:
    return str(body.get("model", "")) if isinstance(body, dict) else ""


def _json_or_none(body: bytes) -> Any:
    if not body:
        return None
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


class Run:
    """The step machine of one agent run. Record with `writer`, replay or fork with `tape`."""

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        upstream: Upstream | None,
        tape: Tape | None = None,
        plan: Plan | None = None,
        writer: TapeWriter | None = None,
        seed: int = 0,
        base_urls: dict[str, str] | None = None,
        prices: PriceTable | None = None,
        limit: SpendLimit | None = None,
        decisions: Decisions = ACTIONS,
        shared: SharedDraws | None = None,
    ) -> None:
        if (tape is None) == (writer is None):
            raise ValueError("a run either records (writer) or replays a tape (tape), not both")
        self.loop = loop
        self.upstream = upstream
        self.tape = tape
        self.plan = plan or Plan()
        self.writer = writer
        self.seed = seed
        self.base_urls = base_urls or {}
        self.prices = prices or PriceTable()
        self.decisions = decisions
        # A fork seed's fresh draws, shared with the seed's other forks in this process
        # (`SharedDraws`); None: every call is sent.
        self.shared = shared
        self.recorded_steps = tape.steps if tape is not None else []
        # The recording's seed: a held step whose request changed is answered again with the
        # recorded draw's randomness (None: unknown, so such a step draws fresh).
        self.recorded_seed = tape.header.seed if tape is not None else None
        self.fresh_draws = 0
        # A `Reask`: whether the provider answered it as the tape did (None: none was sent).
        self.reproduced: bool | None = None
        # Recording: the call car-ray could not read, which ended it (`UnreadableCall`).
        self.unreadable: str | None = None
        # The Responses answers this run gave its agent, by id: the request the agent sent
        # for it, the answer's output items, and whether the provider issued that id (and
        # so can resolve it as a `previous_response_id`).
        self._answers: dict[str, tuple[Any, list[Any], bool]] = {}
        # The ids live answers issued, as the fork reads and sends them (`_read_ids`): a
        # later request is the recorded one when it is so with them read so.
        self._ids: dict[str, str] = {}
        self.step = 0
        self.trajectory: list[dict[str, Any]] = []
        self._checked = 0  # trajectory entries `_on_tape` has compared with the tape
        self._left_tape = False
        self._tape_lock = threading.Lock()
        self.spend = Spend()
        self.divergence: DivergenceError | None = None
        self.blocked: str | None = None
        self.provider_failure: ProviderFailed | None = None
        self.swap: SwapPolicy | None = None
        self.limit = limit
        self.cut = False
        self._lock = asyncio.Lock()
        self._tool_lock = threading.Lock()
        self._pending: dict[int, dict[str, Any]] = {}
        self._next_emit = 0
        self._rng = random.Random(seed)
        self._nondet_cursor: dict[str, int] = {}
        self._used_effects: set[int] = set()

    @property
    def recording(self) -> bool:
        return self.writer is not None

    # -- shared plumbing -------------------------------------------------------------

    def _allocate(self) -> int:
        with self._tool_lock:
            if self.divergence is not None:
                raise ForkAborted(self.divergence.summary())
            if self.blocked is not None:
                raise EffectBlocked(self.blocked)
            if self.provider_failure is not None:
                raise self.provider_failure
            k = self.step
            self.step += 1
            return k

    def _emit(self, step: int, event: dict[str, Any]) -> None:
        """Write events in step order even if an agent overlaps two steps."""
        if self.writer is None:
            return
        with self._tool_lock:
            self._pending[step] = event
            while self._next_emit in self._pending:
                self.writer.append_event(self._pending.pop(self._next_emit))
                self._next_emit += 1

    def _diverge(self, step: int, reason: str, expected: Any = None, observed: Any = None) -> None:
        diffs = (
            json_diff(expected, observed) if expected is not None or observed is not None else []
        )
        error = DivergenceError(step, reason, diffs)
        if self.divergence is None:
            self.divergence = error
            log.info("divergence", step=step, reason=reason)
        raise error

    def _recorded(self, step: int) -> LlmEvent | ToolEvent | None:
        return self.recorded_steps[step] if step < len(self.recorded_steps) else None

    # -- model calls -----------------------------------------------------------------

    def exchange_from_thread(self, request: WireRequest) -> WireResponse:
        """The sync transport's entry: hop onto the run's event loop and wait."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError(
                "a sync client was used inside an async agent; use ctx.async_openai() / "
                "ctx.async_anthropic() / ctx.async_http_client there"
            )
        return asyncio.run_coroutine_threadsafe(self.exchange(request), self.loop).result()

    async def exchange(self, request: WireRequest) -> WireResponse:
        async with self._lock:
            k = self._allocate()
            return await self._exchange(k, request)

    def _on_tape(self) -> bool:
        """Whether every step the run has finished so far reproduced the tape. A probe
        (`Probe`) draws afresh only then: a step met at its recorded request after the run
        left the tape (a tool called with its recorded arguments again, say) keeps its
        mechanism, so the fork stays the fork of its coalition and the probe's draw counts
        as a screen draw exactly when it comes before the fork's first deviation. (A sync
        agent's call still running on another of its threads is not known yet: a probe
        beside it draws.)"""
        assert self.tape is not None
        # Entries are only ever appended: each is checked once (a 65-step tape probes most
        # of its steps, and would compare every entry again at each). A sync agent's tools
        # may call this from its own threads: one at a time.
        with self._tape_lock:
            while self._checked < len(self.trajectory) and not self._left_tape:
                entry = self.trajectory[self._checked]
                self._left_tape = _deviates(entry, self.tape, self.decisions)
                self._checked += 1
            return not self._left_tape

    async def _exchange(self, k: int, request: WireRequest) -> WireResponse:
        path = urlsplit(request.url).path
        body = _json_or_none(request.body)
        if self.recording:
            if codec_for_path(path) is None:
                self._refuse(
                    k,
                    f"{request.method} {path} is not a model call car-ray reads (it reads {READS})",
                )
            response = await self._live(k, request, body, record=True)
            return response
        recorded = self._recorded(k)
        iv = self.plan.interventions.get(k)
        if isinstance(iv, Probe):
            # Re-drawn only while the run is on the tape, at its recorded request; elsewhere
            # it keeps its mechanism.
            if self._on_tape() and self._meets_recorded(recorded, path, body, request):
                return await self._live(k, request, body)
            iv = None
        if isinstance(iv, SeedDraw):
            # The seed's draw where the run is on the tape at the recorded request; a fresh
            # one elsewhere.
            if self._on_tape() and self._meets_recorded(recorded, path, body, request):
                if iv.action is None:
                    return self._serve(k, recorded, "held", body)
                return self._forced(k, request, body, path, iv.action)
            iv = Resample()
        if k < self.plan.first:
            if not isinstance(recorded, LlmEvent):
                what = "nothing more" if recorded is None else f"tool {recorded.name!r}"
                self._diverge(k, f"the agent made a model call ({path}) where the tape has {what}")
                raise AssertionError  # unreachable: _diverge raises
            observed = body if body is not None else request.body.decode("utf-8", "replace")
            if recorded.request.path != path:
                self._diverge(
                    k, "the request went to another endpoint", recorded.request.path, path
                )
            if digest_of(observed) != recorded.request.sha256:
                self._diverge(
                    k,
                    "the request differs from the recorded one",
                    recorded.request.body,
                    observed,
                )
            return self._serve(k, recorded, "replay", body)
        if iv is not None:
            if isinstance(iv, ReplaceObservation):
                raise InterventionError(
                    f"step {k} is a model call: 'observation' replaces tool results; "
                    "use 'action' to force a model's response"
                )
            if isinstance(iv, ForceAction):
                return self._forced(k, request, body, path, iv)
            if isinstance(iv, Reask):
                return await self._reask(k, request, body, recorded, iv)
            if isinstance(iv, EditContext):
                if body is None:
                    raise InterventionError(f"step {k}: the request body is not JSON to edit")
                responses = codec_for_path(path) is RESPONSES
                if responses:
                    # The context is the whole conversation, the provider's part included.
                    body = self._explicit_conversation(body, every=True)
                edited = iv.apply(body)
                request = WireRequest(
                    request.method, request.url, request.headers, canonical_bytes(edited)
                )
                response = await self._live(k, request, edited)
                if responses:
                    # The edit changes this one request: a later request that continues this
                    # answer continues it from the conversation as it was, sent explicitly.
                    self._note_answer(path, body, response.body, issued=False)
                return response
            if isinstance(iv, SwapPolicy):
                self.swap = iv
            assert isinstance(iv, Resample | SwapPolicy)
            return await self._live(k, request, body)
        if (
            self.plan.tail == "pinned"
            and isinstance(recorded, LlmEvent)
            and recorded.request.path == path
        ):
            return self._serve(k, recorded, "pinned", body)
        if self.plan.tail == "held" and self.swap is None:
            # The rest of the run keeps its mechanism: the recorded answer while the request
            # is the recorded one (decision for decision, where the job holds decisions),
            # else an answer drawn with the recorded draw's randomness where the provider
            # couples draws.
            if self._meets_recorded(recorded, path, body, request):
                return self._serve(k, recorded, "held", body)
            couple = self.plan.couple
            if couple is not None:
                # The recorded draw's seed lands nowhere in particular at a changed request:
                # every fork would share one unrelated sample. Each draws its own instead.
                if k in couple and isinstance(recorded, LlmEvent):
                    return await self._coupled(k, request, body, recorded, *couple[k])
                return await self._live(k, request, body)
            if self.recorded_seed is not None:
                return await self._live(
                    k, request, body, draw_seed=step_seed(self.recorded_seed, k)
                )
        return await self._live(k, request, body)

    def _refuse(self, k: int, reason: str) -> NoReturn:
        """End a recording at a call car-ray cannot read (`UnreadableCall`)."""
        self.unreadable = f"step {k}: {reason}"
        log.warning("unreadable_call", step=k, reason=reason)
        raise UnreadableCall(self.unreadable)

    def _explicit_conversation(self, body: Any, *, every: bool = False) -> Any:
        """`explicit_conversation` of a request of this run, through every answer whose id
        the provider did not issue (served from the tape, forced, or answered to an edited
        context), or through every answer (`every`: a context edit sees the whole context).
        The chain stops at an answer the provider issued, whose id it keeps."""
        known = {
            rid: (request, output)
            for rid, (request, output, issued) in self._answers.items()
            if every or not issued
        }
        return explicit_conversation(body, known)

    def _note_answer(self, path: str, body: Any, answer: bytes, *, issued: bool) -> None:
        """Keep a Responses answer this run gave its agent (`_answers`)."""
        if codec_for_path(path) is not RESPONSES or not isinstance(body, dict):
            return
        try:
            response = response_of(answer, bool(body.get("stream")))
        except (ValueError, KeyError, TypeError):
            return
        self._answers[str(response.get("id"))] = (body, response.get("output") or [], issued)

    def _meets_recorded(
        self,
        recorded: LlmEvent | ToolEvent | None,
        path: str,
        body: Any,
        request: WireRequest,
    ) -> TypeGuard[LlmEvent]:
        """Whether a model call is its step's recorded one: a recorded model call, to the same
        endpoint, with its recorded request (`_recorded_request`)."""
        return (
            isinstance(recorded, LlmEvent)
            and recorded.request.path == path
            and self._recorded_request(body, request, recorded)
        )

    def _recorded_request(self, body: Any, request: WireRequest, recorded: LlmEvent) -> bool:
        """Whether a request is step's recorded one: byte for byte, or, where the job holds
        decisions, made by a run that has taken every recorded decision so far (its words
        may differ; that they do not change what the model decides is what holding
        decisions assumes)."""
        observed = body if body is not None else request.body.decode("utf-8", "replace")
        if digest_of(observed) == recorded.request.sha256:
            return True
        if self.decisions.by_decision and self._on_tape():
            return True
        return bool(self._ids) and (
            digest_of(_renamed(observed, self._ids)) == recorded.request.sha256
        )

    def _read_ids(
        self, k: int, path: str, body: Any, response: WireResponse, fields: dict[str, Any]
    ) -> None:
        """Note the ids a fork's live answer to step k issued as the fork reads and sends
        them (`_ids`): the tape's answer's, where it took the tape's action (and, over the
        Responses API, the run has been the tape's up to it); off a provider
        that couples draws, ids of car-ray's own for any other answer, a function of the
        step and the action. A real provider issues fresh ids at every answer, its tool
        calls' among them, and an agent sends them back: without the first, every step
        after a re-draw that drew the recorded action again would meet a request that
        differs from the recorded one in those ids alone and draw afresh; without the
        second, two forks that took the same actions would send a provider requests that
        differ in them, which it then answers as unrelated requests."""
        codec = codec_for_path(path)
        if codec is None or fields["status"] != 200 or fields["action"] is None:
            return
        recorded = self._recorded(k)
        # A Responses answer's id names its whole conversation, which the request did not
        # carry: it is the tape's only where the run has been the tape's so far.
        tapes = (
            isinstance(recorded, LlmEvent)
            and ACTIONS.same(fields["action"], recorded.action)
            and (codec is not RESPONSES or self._on_tape())
        )
        if not tapes and self.plan.couple is None:
            return  # the provider couples draws: another answer keeps its ids
        stream = bool(isinstance(body, dict) and body.get("stream"))
        try:
            live = codec.answer_ids(response.body, stream)
        except (ValueError, KeyError, TypeError):
            return  # an answer whose ids cannot be read keeps its own
        read: tuple[str, ...] | None = None
        if tapes:
            assert isinstance(recorded, LlmEvent)
            try:
                read = codec.answer_ids(recorded.response.body_bytes, recorded.response.stream)
            except (ValueError, KeyError, TypeError):
                read = None
            if read is not None and len(read) != len(live):
                read = None
        if read is None:
            if self.plan.couple is None:
                return
            drawn = digest_of(fields["action"])
            read = tuple(_own_id(a, f"{k}:{drawn}:{i}") for i, a in enumerate(live))
        self._ids.update((a, b) for a, b in zip(live, read, strict=True) if a and b and a != b)

    async def _reask(
        self, k: int, request: WireRequest, body: Any, recorded: Any, iv: Reask
    ) -> WireResponse:
        """Ask step k's request again (`Reask`) and note whether the answer is the tape's."""
        if not isinstance(recorded, LlmEvent):
            raise InterventionError(f"step {k} is not a model call on the tape: nothing to re-ask")
        seed = None
        if iv.seed == "recorded" and self.recorded_seed is not None:
            seed = step_seed(self.recorded_seed, k)
        response = await self._live(k, request, body, draw_seed=seed, share=False)
        entry = self.trajectory[-1]
        # An error answer says nothing about the provider's draws.
        self.reproduced = entry.get("action") == recorded.action if entry["status"] == 200 else None
        return response

    async def _send_fork_call(self, k: int, wire: WireRequest) -> WireResponse:
        """A fork's live call; a provider failure after the upstream's retries ends the fork
        as `provider_error` (recording keeps the answer: the agent saw it live)."""
        assert self.upstream is not None
        try:
            response = await self.upstream.send(wire)
        except (TimeoutError, aiohttp.ClientError, httpx2.TransportError) as exc:
            failure = ProviderFailed(k, None, f"{type(exc).__name__}: {exc}".rstrip(": "))
        else:
            if not is_provider_failure(response.status):
                return response
            self.spend.retries += response.retries
            text = response.body[:200].decode("utf-8", "replace")
            failure = ProviderFailed(k, response.status, f"HTTP {response.status}: {text}")
        self.provider_failure = failure
        log.info("provider_failure", step=k, status=failure.status)
        raise failure

    def _check_limit(self, k: int, body: Any, *, calls: int = 1) -> None:
        """Cut the fork (`BudgetCut`) before `calls` live calls of `body` that could take its
        spend past its reservation."""
        if self.limit is None or (self.limit.usd is None and self.limit.tokens is None):
            return
        # Sized like the reservation was (canonical JSON), so a fork that repeats its
        # recorded calls always fits the reservation made for it.
        tokens, usd = call_bound(
            body,
            self.prices,
            model_of(body),
            self.limit.default_output_tokens,
            self.limit.tokens_per_byte,
        )
        tokens, usd = tokens * calls, usd * calls
        spend = self.spend
        over_usd = self.limit.usd is not None and spend.cost_usd + usd > self.limit.usd
        over_tokens = (
            self.limit.tokens is not None
            and spend.tokens_in + spend.tokens_out + tokens > self.limit.tokens
        )
        if over_usd or over_tokens:
            self.cut = True
            log.info("budget_cut", step=k, spent_usd=spend.cost_usd, bound_usd=usd)
            raise BudgetCut(f"step {k}: the next live call could exceed the fork's reservation")

    def _serve(self, k: int, recorded: LlmEvent, source: Source, body: Any = None) -> WireResponse:
        """The tape's answer to step k (`body`: the request the agent sent for it)."""
        self.trajectory.append(llm_entry(k, _llm_fields(recorded), source))
        asked = body if isinstance(body, dict) else recorded.request.body
        self._note_answer(recorded.request.path, asked, recorded.response.body_bytes, issued=False)
        return WireResponse(
            recorded.response.status,
            tuple(recorded.response.headers.items()),
            recorded.response.body_bytes,
        )

    def _forced(
        self, k: int, request: WireRequest, body: Any, path: str, iv: ForceAction
    ) -> WireResponse:
        codec = codec_for_path(path)
        if codec is None or body is None:
            raise InterventionError(f"step {k}: 'action' needs a known provider endpoint")
        chat = codec.parse_request(body)
        if iv.body is not None:
            if chat.stream:
                raise InterventionError(
                    f"step {k} streams its response: force it with 'text' / 'tool_calls', "
                    "not a whole 'body'"
                )
            data = canonical_bytes(iv.body)
            action, _ = codec.parse_response(data, False)
        else:
            action = iv.action()
            data = codec.render_response(
                chat, action, Usage(), f"forced-{sha256_hex(canonical_bytes(body))[:16]}"
            )
        content_type = "text/event-stream" if chat.stream else "application/json"
        self._note_answer(path, body, data, issued=False)
        self.trajectory.append(
            llm_entry(
                k,
                {
                    "provider": codec.provider,
                    "model": chat.model,
                    "status": 200,
                    "action": action.to_json(),
                },
                "forced",
            )
        )
        return WireResponse(200, (("content-type", content_type),), data)

    def _prepared(
        self, request: WireRequest, body: Any, *, record: bool
    ) -> tuple[WireRequest, Any]:
        """The request as a fork sends it: a Responses conversation spelled out through
        answers the provider never issued; to a stateless API (chat completions, messages),
        the ids the fork's answers issued as it reads them (`_read_ids`), so a provider that
        replays an identical request with its seed replays it whichever ids its answers
        drew; and a swapped model or endpoint."""
        codec = codec_for_path(urlsplit(request.url).path)
        if codec is RESPONSES and not record:
            expanded = self._explicit_conversation(body)
            if expanded is not body:
                body = expanded
                request = WireRequest(
                    request.method, request.url, request.headers, canonical_bytes(body)
                )
        elif self._ids and not record and body is not None:
            # (A Responses conversation the provider keeps refers to the ids it issued.)
            renamed = _renamed(body, self._ids)
            if renamed != body:
                body = renamed
                request = WireRequest(
                    request.method, request.url, request.headers, canonical_bytes(body)
                )
        if self.swap is not None and codec is not None and body is not None:
            if self.swap.model is not None:
                body = {**body, "model": self.swap.model}
            url = request.url
            if self.swap.base_url is not None:
                base = self.base_urls.get(codec.provider, "")
                if base and url.startswith(base):
                    url = self.swap.base_url.rstrip("/") + url[len(base.rstrip("/")) :]
            request = WireRequest(request.method, url, request.headers, canonical_bytes(body))
        return request, body

    async def _call(
        self,
        k: int,
        request: WireRequest,
        body: Any,
        seed: int,
        *,
        record: bool = False,
        share: bool = False,
    ) -> tuple[WireResponse, dict[str, Any], Usage]:
        """Send one prepared call with `seed` and read its answer: the response, the
        trajectory fields and the usage. A fork's call is counted in its spend. The seed goes
        in SEED_HEADER and, to a chat completion, in the body's `seed` too (OpenAI's, best
        effort for an identical request), in place of any the agent set: every draw of a
        step must be its own (`seeded_body`; the tape keeps the agent's body). With `share`
        (a fresh draw), a call another fork of the seed made with the same seed and request
        is answered as it was (`SharedDraws`), and not paid for again; a Responses call
        never is (the provider keeps its conversation by the ids it issued)."""
        codec = codec_for_path(urlsplit(request.url).path)
        headers = (
            *((name, value) for name, value in request.headers if name.lower() != SEED_HEADER),
            (SEED_HEADER, str(seed)),
        )
        data = seeded_body(request.body, body, seed) if codec is OPENAI else request.body
        wire = WireRequest(request.method, request.url, headers, data)
        drawn = False  # answered with a draw another fork paid for
        if record:
            assert self.upstream is not None  # `_need_upstream` checked it
            response = await self.upstream.send(wire)
        elif share and self.shared is not None and codec is not RESPONSES:
            key = draw_key(seed, request.url, body, data)
            response, drawn = await self.shared.draw(key, lambda: self._send_fork_call(k, wire))
        else:
            response = await self._send_fork_call(k, wire)
        stream = bool(isinstance(body, dict) and body.get("stream"))
        action: Action | None = None
        usage = Usage()
        if codec is RESPONSES and response.status == 200 and not record:
            self._note_answer(urlsplit(request.url).path, body, response.body, issued=True)
        if codec is not None and response.status == 200:
            try:
                action, usage = codec.parse_response(response.body, stream)
                if usage == Usage() and isinstance(body, dict):
                    # A stream without usage (openai without include_usage): estimate, so
                    # that the budget never counts a real call as free.
                    usage = estimate_usage(codec.parse_request(body), action)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("unparsed_response", step=k, error=str(exc))
                if record:
                    what = urlsplit(request.url).path
                    self._refuse(k, f"the answer to POST {what} is not one car-ray reads ({exc})")
        model = model_of(body)
        fields = {
            "provider": codec.provider if codec else "http",
            "model": model,
            "status": response.status,
            "action": action.to_json() if action else None,
        }
        if drawn:
            return response, fields, usage
        self.spend.retries += response.retries
        if not record:
            self.spend.tail_calls += 1
            self.spend.tokens_in += usage.input_tokens
            self.spend.tokens_out += usage.output_tokens
            self.spend.cost_usd += self.prices.cost_usd(model, usage)
        return response, fields, usage

    def _need_upstream(self, k: int) -> None:
        if self.upstream is None:
            # A replay has no network path: an unrecorded request is an error, never a call.
            self._diverge(k, "the run needs a live call but has no live provider (replay only)")

    async def _live(
        self,
        k: int,
        request: WireRequest,
        body: Any,
        *,
        record: bool = False,
        draw_seed: int | None = None,
        share: bool = True,
    ) -> WireResponse:
        """One call to the provider. Recording draws with the recording's seed; a fork draws
        fresh (`fresh_seed`) unless `draw_seed` holds the recorded draw's. A fresh draw is
        shared with the seed's other forks unless `share` is False (a `Reask` asks the
        provider itself)."""
        self._need_upstream(k)
        request, body = self._prepared(request, body, record=record)
        if record:
            seed = step_seed(self.seed, k)
        elif draw_seed is not None:
            seed = draw_seed
        else:
            seed = fresh_seed(self.seed, k)
            self.fresh_draws += 1
        if not record:
            self._check_limit(k, body)
        response, fields, usage = await self._call(
            k, request, body, seed, record=record, share=share and draw_seed is None
        )
        self.trajectory.append(
            llm_entry(k, fields, "rederived" if draw_seed is not None else "live")
        )
        if not record:
            self._read_ids(k, urlsplit(request.url).path, body, response, fields)
            return response
        text: str | None
        try:
            text = response.body.decode("utf-8")
            b64 = None
        except UnicodeDecodeError:
            text, b64 = None, base64.b64encode(response.body).decode()
        observed = body if body is not None else request.body.decode("utf-8", "replace")
        self._emit(
            k,
            {
                "type": "llm",
                "step": k,
                **{f: fields[f] for f in ("provider", "model", "action")},
                "request": {
                    "method": request.method,
                    "path": urlsplit(request.url).path,
                    "headers": {
                        n.lower(): v
                        for n, v in request.headers
                        if n.lower() in TAPE_REQUEST_HEADERS
                    },
                    "body": observed,
                    "sha256": digest_of(observed),
                },
                "response": {
                    "status": response.status,
                    "headers": {
                        n.lower(): v
                        for n, v in response.headers
                        if n.lower() in TAPE_RESPONSE_HEADERS
                    },
                    "stream": bool(isinstance(body, dict) and body.get("stream")),
                    "body_text": text,
                    "body_b64": b64,
                    "sha256": sha256_hex(response.body),
                },
                "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens},
                "retries": response.retries,
                "latency_s": round(response.latency_s, 6),
            },
        )
        return response

    async def _coupled(
        self, k: int, request: WireRequest, body: Any, recorded: LlmEvent, share: float, draws: int
    ) -> WireResponse:
        """A held step that chose at its recorded request, met at a changed one, where the
        provider cannot replay a draw (`Plan.couple`). A maximal coupling of the recorded
        distribution p and the changed one p' keeps the recorded decision d with probability
        min(1, p'(d) / p(d)) and otherwise draws from what p' adds. `share` is p(d) read low
        (`DecisionShares.low_share`); `draws` calls of the changed request estimate p'(d) as
        the share of them that decide d; the step keeps d (answering with one of those draws)
        with the chance `keep_chances` gives that count, the nearest min(1, p'(d) / `share`)
        at its worst, and otherwise answers with a draw that decided otherwise. Every draw is
        a live call in the fork's spend unless another fork of the seed made it
        (`SharedDraws`). What it cannot do: a finite number of draws keeps d
        less often than the coupling would where p'(d) is near p(d) (with 4 draws at p' = p
        = 0.5, 0.89 of the time against 1), and the other answer is drawn from p', not from
        what p' adds to p."""
        self._need_upstream(k)
        request, body = self._prepared(request, body, record=False)
        self._check_limit(k, body, calls=draws)
        # Every draw settles before the fork goes on or fails: each is paid for, and the
        # fork's spend must hold them all when its row is written.
        settled = await asyncio.gather(
            *(
                self._call(k, request, body, coupling_seed(self.seed, k, j), share=True)
                for j in range(draws)
            ),
            return_exceptions=True,
        )
        self.fresh_draws += draws
        failed = [a for a in settled if isinstance(a, BaseException)]
        if failed:
            raise failed[0]
        answers = [a for a in settled if not isinstance(a, BaseException)]
        decided = self.decisions.decision(recorded.action)
        same = [
            i
            for i, (_, fields, _) in enumerate(answers)
            if fields["status"] == 200 and self.decisions.decision(fields["action"]) == decided
        ]
        chance = keep_chances(draws, share)[len(same)]
        keep = random.Random(coupling_seed(self.seed, k, -1)).random() < chance
        others = [i for i in range(draws) if i not in same]
        chosen = same[0] if (keep and same) or not others else others[0]
        response, fields, _ = answers[chosen]
        self.trajectory.append(llm_entry(k, fields, "coupled"))
        self._read_ids(k, urlsplit(request.url).path, body, response, fields)
        return response

    # -- tool calls ------------------------------------------------------------------

    def tool(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        effect: bool,
    ) -> Any:
        arguments = _tool_arguments(name, args, kwargs)
        k = self._allocate()
        decision = self._decide_tool(k, name, arguments, effect)
        if decision is not None:
            return self._finish_tool(k, decision)
        started = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            self._ran_tool(k, name, arguments, effect, None, exc, started)
            raise
        # The agent gets the value as a replay will serve it, so both runs see the same.
        return self._ran_tool(k, name, arguments, effect, value, None, started)

    async def atool(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        effect: bool,
    ) -> Any:
        arguments = _tool_arguments(name, args, kwargs)
        async with self._lock:
            k = self._allocate()
            decision = self._decide_tool(k, name, arguments, effect)
            if decision is not None:
                return self._finish_tool(k, decision)
            started = time.perf_counter()
            try:
                value = await fn(*args, **kwargs)
            except Exception as exc:
                self._ran_tool(k, name, arguments, effect, None, exc, started)
                raise
            return self._ran_tool(k, name, arguments, effect, value, None, started)

    def _decide_tool(
        self, k: int, name: str, arguments: dict[str, Any], effect: bool
    ) -> tuple[ToolEvent, Source] | None:
        """None: run the tool. Otherwise the event to serve instead, and why."""
        if self.recording:
            return None
        recorded = self._recorded(k)
        iv = self.plan.interventions.get(k)
        if isinstance(iv, Probe):
            # Run again only while the run is on the tape, on its recorded call; elsewhere
            # it keeps its mechanism.
            if (
                self._on_tape()
                and isinstance(recorded, ToolEvent)
                and recorded.name == name
                and digest_of(recorded.arguments) == digest_of(arguments)
            ):
                return self._live_tool(k, name, arguments, effect)
            iv = None
        if k < self.plan.first:
            if not isinstance(recorded, ToolEvent):
                what = "nothing more" if recorded is None else "a model call"
                self._diverge(k, f"the agent called tool {name!r} where the tape has {what}")
                raise AssertionError
            if recorded.name != name:
                self._diverge(k, "the agent called another tool", recorded.name, name)
            if digest_of(recorded.arguments) != digest_of(arguments):
                self._diverge(
                    k, f"tool {name!r} got other arguments", recorded.arguments, arguments
                )
            return recorded, "replay"
        if iv is not None:
            if isinstance(iv, ReplaceObservation):
                error = ToolError(type="ToolFailed", message=iv.error) if iv.error else None
                replaced = ToolEvent(
                    step=k,
                    name=name,
                    arguments=arguments,
                    effect=effect,
                    result=None if error else iv.result,
                    error=error,
                    prev="",
                )
                return replaced, "forced"
            if isinstance(iv, ForceAction | EditContext | Reask | SeedDraw):
                raise InterventionError(
                    f"step {k} is tool {name!r}: '{iv.kind}' applies to model calls; "
                    "use 'observation' to replace a tool's result"
                )
            if isinstance(iv, SwapPolicy):
                self.swap = iv
            else:
                return self._live_tool(k, name, arguments, effect)
        if self.plan.tail == "pinned" and isinstance(recorded, ToolEvent) and recorded.name == name:
            return recorded, "pinned"
        if (
            self.plan.tail == "held"
            and isinstance(recorded, ToolEvent)
            and recorded.name == name
            and digest_of(recorded.arguments) == digest_of(arguments)
        ):
            # A tool is a function of its arguments: the same call gets the recorded result.
            return recorded, "held"
        return self._live_tool(k, name, arguments, effect)

    def _live_tool(
        self, k: int, name: str, arguments: dict[str, Any], effect: bool
    ) -> tuple[ToolEvent, Source] | None:
        if not effect:
            return None
        # An effectful tool never runs outside a recording: serve a recorded call with the
        # same arguments, or end the fork.
        for event in self.recorded_steps:
            if (
                isinstance(event, ToolEvent)
                and event.step not in self._used_effects
                and event.name == name
                and digest_of(event.arguments) == digest_of(arguments)
            ):
                self._used_effects.add(event.step)
                return event, "replay"
        blocked = ToolEvent(step=k, name=name, arguments=arguments, effect=True, prev="")
        return blocked, "blocked"

    def _finish_tool(self, k: int, decision: tuple[ToolEvent, Source]) -> Any:
        event, source = decision
        self.trajectory.append(tool_entry(k, event, source))
        if source == "blocked":
            self.blocked = event.name
            log.info("effect_blocked", step=k, tool=event.name)
            raise EffectBlocked(f"step {k}: effectful tool {event.name!r} blocked in a fork")
        if event.error is not None:
            cls = getattr(builtins, event.error.type, None)
            if isinstance(cls, type) and issubclass(cls, Exception):
                try:
                    raise cls(event.error.message)
                except TypeError:
                    pass
            raise ToolFailed(event.error.type, event.error.message)
        return event.result

    def _ran_tool(
        self,
        k: int,
        name: str,
        arguments: dict[str, Any],
        effect: bool,
        value: Any,
        exc: Exception | None,
        started: float,
    ) -> Any:
        if exc is None:
            try:
                result = json_roundtrip(value)
            except (TypeError, ValueError) as bad:
                raise TypeError(
                    f"tool {name!r} returned a value that is not JSON ({bad}); "
                    "return plain data from tools"
                ) from None
            error = None
        else:
            result, error = None, ToolError(type=type(exc).__name__, message=str(exc))
        event = ToolEvent(
            step=k,
            name=name,
            arguments=arguments,
            effect=effect,
            result=result,
            error=error,
            latency_s=round(time.perf_counter() - started, 6),
            prev="",
        )
        self.trajectory.append(tool_entry(k, event, "live"))
        self._emit(k, event.model_dump(mode="json", exclude={"prev"}))
        return result

    # -- nondeterminism ----------------------------------------------------------------

    def nondet(self, kind: Literal["now", "uuid4", "random"], draw: Callable[[], Any]) -> Any:
        if self.recording:
            value = draw()
            assert self.writer is not None
            self.writer.append_event({"type": "nondet", "kind": kind, "value": value})
            return value
        assert self.tape is not None
        cursor = self._nondet_cursor.get(kind, 0)
        self._nondet_cursor[kind] = cursor + 1
        recorded = [e.value for e in self.tape.nondet if e.kind == kind]
        if cursor < len(recorded):
            return recorded[cursor]
        # Past the tape, draws are fresh but seeded: the same fork draws the same values.
        if kind == "random":
            return self._rng.random()
        if kind == "uuid4":
            return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        last = float(recorded[-1]) if recorded else 1_767_225_600.0
        return last + 0.001 * (cursor - len(recorded) + 1)
