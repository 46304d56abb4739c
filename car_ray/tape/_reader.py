"""Loading a tape: schema, body hashes and the hash chain are checked line by line."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .._canon import digest_of, line_bytes, sha256_hex
from .._files import UnreadableFile, read_regular_file
from ._model import (
    FORMAT,
    VERSION,
    Event,
    LlmEvent,
    NondetEvent,
    Step,
    TapeHeader,
    TapeSeal,
    ToolEvent,
)

_EVENT = TypeAdapter(Event)


class TapeError(ValueError):
    """A tape that cannot be trusted: names the file, the line and what is wrong (line 0:
    the file as a whole, e.g. one that cannot be read)."""

    def __init__(self, path: Path, line: int, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        super().__init__(f"{path}:{line}: {problem}" if line else f"{path}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (a worker, a pool) whole
        return (type(self), (self.path, self.line, self.problem), self.__dict__)


@dataclass
class Tape:
    """A loaded tape. `sealed` is False for a truncated recording (inspect it, do not fork it)."""

    path: Path
    header: TapeHeader
    events: list[LlmEvent | ToolEvent | NondetEvent]
    seal: TapeSeal | None
    notes: list[str] = field(default_factory=list)
    chain_tail: str = ""

    @property
    def sealed(self) -> bool:
        return self.seal is not None

    @property
    def tape_id(self) -> str:
        """The seal's digest; an unsealed tape is named by its chain so far, marked `partial-`."""
        if self.seal is not None:
            return self.seal.digest
        return "partial-" + self.chain_tail

    @cached_property
    def run_digest(self) -> str:
        """What the run did, without when or where it was recorded: the agent, input and
        seed, and every step's request and response (llm) or call and result (tool). Two
        recordings of one seeded scenario share it (their tape ids differ: the header's time
        and the provider's port are in the chain); two distinct runs do not (a real
        provider's responses carry their own ids)."""
        steps: list[Any] = []
        for e in self.steps:
            if isinstance(e, LlmEvent):
                steps.append(["llm", e.request.sha256, e.response.sha256])
            else:
                error = None if e.error is None else e.error.model_dump()
                steps.append(["tool", e.name, e.arguments, e.result, error])
        head = self.header
        return digest_of([head.agent, head.input, head.seed, steps])

    @cached_property
    def steps(self) -> list[Step]:
        return [e for e in self.events if e.type in ("llm", "tool")]

    @cached_property
    def nondet(self) -> list[NondetEvent]:
        return [e for e in self.events if e.type == "nondet"]

    def require_sealed(self) -> None:
        if self.seal is None:
            raise TapeError(
                self.path,
                len(self.events) + 2,
                "the tape is incomplete (no seal line: the recording was cut off); "
                "it can be inspected but not replayed or forked",
            )


def load_tape(path: Path | str) -> Tape:
    """Read and verify a tape; raise `TapeError` naming the first bad line."""
    path = Path(path)
    try:
        raw = read_regular_file(path)
    except UnreadableFile as exc:
        raise TapeError(path, 0, str(exc)) from None
    return parse_tape(raw, path)


def parse_tape(raw: bytes, path: Path) -> Tape:
    """Verify a tape's bytes (`path` names it in errors): a worker gets tapes as bytes."""
    lines = raw.split(b"\n")
    torn = lines[-1] != b""
    if not torn:
        lines = lines[:-1]
    notes: list[str] = []
    if not lines or lines == [b""]:
        raise TapeError(path, 1, "empty file: not a car-ray tape")

    def parse(number: int, data: bytes) -> dict[str, Any] | None:
        try:
            value = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if number == len(lines) and torn:
                notes.append(f"line {number}: torn last line dropped (recording cut mid-write)")
                return None
            raise TapeError(path, number, f"not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise TapeError(path, number, "a tape line must be a JSON object")
        return value

    first = parse(1, lines[0])
    if first is None or first.get("type") != "header":
        raise TapeError(path, 1, "the first line must be the tape header")
    if first.get("format") != FORMAT:
        raise TapeError(path, 1, f"format {first.get('format')!r} is not {FORMAT!r}")
    if first.get("version") != VERSION:
        raise TapeError(
            path,
            1,
            f"tape format version {first.get('version')!r} is not supported "
            f"(this car-ray reads version {VERSION}); use the car-ray that wrote it",
        )
    try:
        header = TapeHeader.model_validate(first)
    except ValidationError as exc:
        raise TapeError(path, 1, f"bad header: {_first_error(exc)}") from None
    chain = sha256_hex(lines[0])

    events: list[LlmEvent | ToolEvent | NondetEvent] = []
    seal: TapeSeal | None = None
    steps = 0
    for number, data in enumerate(lines[1:], start=2):
        value = parse(number, data)
        if value is None:
            break
        if seal is not None:
            raise TapeError(path, number, "a line follows the seal: the tape was appended to")
        if value.get("prev") != chain:
            raise TapeError(
                path,
                number,
                f"hash chain broken: 'prev' does not match the digest of line {number - 1} "
                f"(line {number - 1} or {number} was edited, or lines were reordered or "
                "removed): a tape is data car-ray checks, not a file to edit; record it again "
                "(car-ray record), or restore it from where it was kept",
            )
        if value.get("type") == "seal":
            try:
                seal = TapeSeal.model_validate(value)
            except ValidationError as exc:
                raise TapeError(path, number, f"bad seal: {_first_error(exc)}") from None
            if seal.digest != sha256_hex(
                line_bytes({k: v for k, v in value.items() if k != "digest"})
            ):
                raise TapeError(
                    path,
                    number,
                    "the seal's digest does not match its contents (the seal was edited): "
                    "record the tape again (car-ray record), or restore it from where it was kept",
                )
            if seal.events != len(events) or seal.steps != steps:
                raise TapeError(path, number, "the seal's event count does not match the tape")
            continue
        try:
            event = _EVENT.validate_python(value)
        except ValidationError as exc:
            raise TapeError(
                path, number, f"bad {value.get('type')!r} event: {_first_error(exc)}"
            ) from None
        if event.type in ("llm", "tool"):
            if event.step != steps:
                raise TapeError(
                    path, number, f"step {event.step} is out of order (expected {steps})"
                )
            steps += 1
        if isinstance(event, LlmEvent):
            _check_bodies(path, number, event)
        events.append(event)
        chain = sha256_hex(data)
    tape = Tape(
        path=path, header=header, events=events, seal=seal, notes=notes, chain_tail=chain[:16]
    )
    if seal is None:
        notes.append("incomplete: no seal line (the recording was cut off)")
    return tape


def _check_bodies(path: Path, number: int, event: LlmEvent) -> None:
    if digest_of(event.request.body) != event.request.sha256:
        raise TapeError(path, number, f"step {event.step}: request body does not match its sha256")
    if sha256_hex(event.response.body_bytes) != event.response.sha256:
        raise TapeError(path, number, f"step {event.step}: response body does not match its sha256")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(line)"
    return f"{where}: {err['msg']}"
