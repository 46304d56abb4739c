"""`<out>/<job_id>/job.json`: the job's request, status, spend, timings and versions, as one
typed, versioned model (`JobInfo`) that writes and reads the file.

A key is in the file once the run has set it (a job.json written at the start has no
`finished`), at every level: a file read and written again keeps its keys. A file without
`version` is version 1 (what car-ray wrote before the field existed); a newer version is
refused by name, not misread. Unknown keys are kept: a reader never drops what a writer put
there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from .._answer import Answer
from .._notes import Note
from ._output import JobDir

# 2: notes are objects (`Note`: kind, severity, text, figures), and `answer` is kept.
JOB_JSON_VERSION = 2


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", validate_assignment=True)


class Spend(_Record):
    """Forks, dollars and tokens (the ledger's `Cost`)."""

    forks: int = 0
    usd: float = 0.0
    tokens: int = 0


class Caps(_Record):
    """The budget: None is no cap on that dimension."""

    max_forks: int | None = None
    max_usd: float | None = None
    max_tokens: int | None = None
    max_wall_s: float | None = None


class Remaining(_Record):
    forks: int | None = None
    usd: float | None = None
    tokens: int | None = None
    wall_s: float | None = None


class Reservations(_Record):
    """Reserved against settled, over the settled forks that spent anything."""

    forks: int = 0
    reserved: Spend = Field(default_factory=Spend)
    settled: Spend = Field(default_factory=Spend)
    median_ratio: float | None = None
    ratio_of: str | None = None


class Ledger(_Record):
    """The budget ledger (`BudgetGovernor.snapshot()`): a resumed run counts from it."""

    caps: Caps | None = None
    spent: Spend = Field(default_factory=Spend)
    reserved: Spend | None = None
    # Reservations of forks an earlier run left in flight: counted against the caps.
    carried: Spend | None = None
    # Open reservations by ledger key (None: written before they were saved).
    open: dict[str, Spend] | None = None
    remaining: Remaining | None = None
    in_flight: int = 0
    settled: int = 0
    lost: int = 0
    elapsed_s: float | None = None
    exhausted: str | None = None
    reservations: Reservations | None = None


class TapeRef(_Record):
    id: str
    path: str | None = None
    steps: int | None = None


class RayInfo(_Record):
    """Where the job ran: how the driver got its Ray, the GCS address, live nodes and CPUs."""

    how: str | None = None  # "embedded", "joined" or "already" (older files: `embedded`)
    address: str | None = None
    nodes: int = 0
    cpus: float = 0.0


class ProgressInfo(_Record):
    stage: str
    done: int = 0
    in_flight: int = 0
    resumed: int = 0
    lost: int = 0
    provider_errors: int = 0
    spent: Spend = Field(default_factory=Spend)


class StageTime(_Record):
    forks: int = 0
    wall_s: float = 0.0


class StageState(_Record):
    """The stage a job was in at its last checkpoint and what it held (`Stage.state()`: the
    screen's candidates, the Shapley seeds done, ...). Resume does not need it (a resumed
    job replays its rows into its stages); it says where a running job is."""

    name: str
    state: dict[str, Any] = Field(default_factory=dict)


class JobJsonError(ValueError):
    """A job.json this car-ray cannot read; the message names the file and the key."""


class JobInfo(_Record):
    """`job.json`, in its keys' order. `request` is the job as it was given (the job file's
    model at the time, as JSON), kept as written so an older request still reads."""

    version: int = JOB_JSON_VERSION
    job_id: str
    name: str | None = None
    status: str
    request: dict[str, Any] = Field(default_factory=dict)
    job_file: str | None = None
    # sha256 of the agent, scorer and policy sources (absent before job ids covered code).
    code: dict[str, str] = Field(default_factory=dict)
    tape: TapeRef | None = None
    budget: Caps | None = None
    # ISO 8601, UTC (seconds since the epoch in files written before issue 11).
    started: str | float | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    resumed_rows: int = 0
    runs: int = 0
    ray: RayInfo | None = None
    workers: list[int] = Field(default_factory=list)  # the ForkWorker pids
    ledger: Ledger | None = None
    progress: ProgressInfo | None = None
    shapley_candidates: list[int] = Field(default_factory=list)
    notes: list[Note] = Field(default_factory=list)
    finished: str | float | None = None  # as `started`
    wall_s: float | None = None
    lost_forks: int = 0
    # Forks that ended as provider_error (never scored, each run again).
    provider_errors: int = 0
    fork_statuses: dict[str, int] = Field(default_factory=dict)
    stages: dict[str, StageTime] = Field(default_factory=dict)
    stage: StageState | None = None  # as of the last checkpoint
    recorded_outcome: float | None = None  # the scorer's value on the tape
    verdict: str | None = None
    top_cause: dict[str, Any] | None = None
    # What the forks let the job claim (`Answer`); absent in files written before it.
    answer: Answer | None = None

    @field_validator("notes", mode="before")
    @classmethod
    def _text_notes(cls, value: Any) -> Any:
        """A version 1 file's notes are lines of text (`Note.legacy`)."""
        if isinstance(value, list):
            return [Note.legacy(n) if isinstance(n, str) else n for n in value]
        return value

    @field_serializer("notes")
    def _notes_as_read(self, notes: list[Note]) -> list[Any]:
        """Each note as an object, but one read as a line of text, which is written back
        as it was (a file read and written again keeps its values)."""
        return [n.text if n.kind == "note" else n.model_dump(mode="json") for n in notes]

    def to_json(self) -> str:
        """The file's text: the keys set so far (and `version`, first), pretty, no NaN."""
        data = {"version": self.version, **self.model_dump(mode="json", exclude_unset=True)}
        try:
            return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"job.json of job {self.job_id!r}: {exc} (give plain JSON values: str, "
                "number, bool, None, list, dict; no NaN)"
            ) from None

    def write(self, out: str | Path) -> str:
        """Write `<out>/<job_id>/job.json`, replacing it atomically (a reader sees the old
        file or the new one, never a mix); returns its path."""
        text = self.to_json()
        job = JobDir.of(out, self.job_id)
        job.make_dir()
        job.write_atomic(text.encode("utf-8"), "job.json")
        return job.join("job.json")

    @classmethod
    def read(cls, out: str | Path, job_id: str) -> JobInfo | None:
        """`<out>/<job_id>/job.json`, or None if the job has not written one; a file this
        car-ray cannot read is a `JobJsonError` naming it."""
        job = JobDir.of(out, job_id)
        data = job.read_bytes("job.json")
        return None if data is None else cls.parse(data, job.join("job.json"))

    @classmethod
    def parse(cls, data: bytes, where: str) -> JobInfo:
        """A job.json's bytes (`where` names the file in errors)."""
        try:
            value = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise JobJsonError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(value, dict):
            raise JobJsonError(f"{where}: expected a JSON object, got {type(value).__name__}")
        version = value.get("version", 1)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise JobJsonError(f"{where}: 'version' is {version!r}; expected 1 or more")
        if version > JOB_JSON_VERSION:
            raise JobJsonError(
                f"{where}: job.json version {version}, written by a newer car-ray; this one "
                f"reads up to version {JOB_JSON_VERSION}. Upgrade car-ray to read or resume "
                "this job"
            )
        if "version" not in value:  # written before the key existed
            value = {**value, "version": 1}
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(part) for part in first["loc"])
            shown = repr(first.get("input"))
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise JobJsonError(
                f"{where}: key {key!r}: {first['msg']} (got {shown}); this car-ray cannot "
                "read this job.json"
            ) from None
