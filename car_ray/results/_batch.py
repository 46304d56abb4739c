"""A batch's (or a sweep's) own files, beside its traces' job folders:

    <out>/<batch_id>/batch.json          BatchInfo: request, budget, ledger, status per trace
    <out>/<batch_id>/traces.parquet      TraceRow: one row per trace, its verdict and spend
    <out>/<batch_id>/summary.parquet     SummaryRow: what carries the blame across traces
    <out>/<batch_id>/report.html         the batch page, linking each trace's report
    <out>/<batch_id>/trace=<id>/...      each trace's job folder (forks/, attribution, job.json)

A sweep's cells are `cell=<name>` folders in place of `trace=<id>`. Read every trace's fork
rows as one dataset with hive partitioning (`trace` is then a column):
`pyarrow.dataset.dataset(f"{out}/{batch_id}", partitioning="hive")` over `*/forks/*.parquet`
(`batch_forks`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..replay import Int32
from ._jobjson import Caps, JobJsonError, Spend
from ._output import JobDir
from ._rows import RowShape

BATCH_JSON_VERSION = 1

# How a batch's budget is split over its traces (`car-ray batch --split`): `equal` gives each
# the same cap; `priority` caps each in proportion to its manifest priority; `adaptive` caps
# none below the batch's own (a trace whose top cause separates stops and leaves its unspent
# share to the others: the shared ledger is the limit).
Split = Literal["equal", "priority", "adaptive"]

# A trace the batch could not attribute: why, in one word (the row's `reason` says more).
Unattributable = Literal["corrupt", "not_failing", "other_agent", "divergent", "agent_error"]


class TraceRow(BaseModel):
    """A row of `traces.parquet`: one trace (or sweep cell) of the batch. `status` is its job's
    (complete, budget_exhausted, nothing_measured, failed, interrupted, ...) or one of
    `Unattributable`'s words (or `pending`: not run yet, the batch was stopped first)."""

    trace: str  # the partition value: the tape id (a sweep: the cell name)
    tape: str  # the tape's path or URI as given
    tape_id: str | None = None
    folder: str  # relative to the batch folder: trace=<id>
    status: str
    reason: str | None = None  # one line, for an unattributable or failed trace
    priority: float | None = None
    cap_usd: float | None = None  # its share of the batch's budget
    cap_forks: int | None = None
    forks: int = 0
    usd: float = 0.0
    tokens: int = 0
    wall_s: float | None = None
    verdict: str | None = None
    # What its job could claim (`Answer.kind`: separated, precise, nothing, lead, unanswered,
    # measured); None when no job ran or its job.json predates answers.
    answer: str | None = None
    # Its rank-1 cause (`results.top_cause`): the first step, and whether it stands alone.
    top_step: Int32 | None = None
    top_kind: str | None = None  # llm or tool
    top_tool: str | None = None  # the tool it called (llm) or that answered (tool)
    top_model: str | None = None  # provider:model of an llm step
    top_intervention: str | None = None
    top_measure: str | None = None  # phi or flip_rate
    top_value: float | None = None
    top_lo: float | None = None
    top_hi: float | None = None
    top_what: str | None = None
    top_alone: bool | None = None  # no other step's interval reaches it
    # The failure's root, where an arm on what the agent was given shows one
    # (`results.root_cause`): its step, intervention (observation or context), the tool whose
    # result it replaced (an observation), and how often replacing it cleared the failure.
    root_step: Int32 | None = None
    root_intervention: str | None = None
    root_tool: str | None = None
    root_value: float | None = None
    root_lo: float | None = None
    root_hi: float | None = None
    root_what: str | None = None
    # What the trace was planted with, when the manifest says (generated traces).
    planted: str | None = None
    planted_step: Int32 | None = None
    # A sweep cell's settings (what it changed from the job file), as JSON.
    settings: str | None = None


class SummaryRow(BaseModel):
    """A row of `summary.parquet`: across the batch's attributed traces, how many name `key`
    of `dimension` (root: the root they name; step, tool, model, intervention: of their
    rank-1 cause; status: how every trace ended; answer: what each job that ran could claim),
    out of `of`, with a Wilson interval on the share at `confidence`."""

    dimension: str
    key: str
    traces: int
    of: int
    share: float
    share_lo: float
    share_hi: float
    confidence: float


TRACE_ROWS = RowShape.of("trace row", "trace", TraceRow)
SUMMARY_ROWS = RowShape.of("summary row", "key", SummaryRow)


class TraceState(BaseModel):
    """A trace in `batch.json`: where it is, what it was given and how it ended."""

    model_config = ConfigDict(extra="allow")

    tape: str
    tape_id: str | None = None
    folder: str
    job_id: str  # the trace's job in the batch folder (its folder's name)
    priority: float | None = None
    planted: str | None = None
    status: str = "pending"
    reason: str | None = None
    cap: Caps | None = None
    settings: dict[str, Any] | None = None  # a sweep cell's settings


class BatchInfo(BaseModel):
    """`<out>/<batch_id>/batch.json`: written at the start, at every checkpoint and at the
    end; a rerun on the same output reads it to continue the batch under the same budget."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    version: int = BATCH_JSON_VERSION
    batch_id: str
    kind: Literal["batch", "sweep"] = "batch"
    status: str = "running"
    job_file: str | None = None  # the first job file (its provider runs the pool)
    job_files: list[str] = Field(default_factory=list)  # one per agent
    request: dict[str, Any] = Field(default_factory=dict)
    split: Split = "adaptive"
    budget: Caps | None = None
    spent: Spend = Field(default_factory=Spend)
    runs: int = 0
    started: str | None = None
    finished: str | None = None
    wall_s: float | None = None
    busy_share: float | None = None  # of wall time, the share with forks in flight
    traces: dict[str, TraceState] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)

    def write(self, out: str) -> str:
        folder = JobDir.of(out, self.batch_id)
        folder.make_dir()
        folder.write_atomic(self.model_dump_json(indent=2).encode() + b"\n", "batch.json")
        return folder.join("batch.json")

    @classmethod
    def read(cls, out: str, batch_id: str) -> BatchInfo | None:
        folder = JobDir.of(out, batch_id)
        data = folder.read_bytes("batch.json")
        if data is None:
            return None
        try:
            info = cls.model_validate_json(data)
        except ValueError as exc:
            raise JobJsonError(
                f"{folder.join('batch.json')}: not a batch.json this car-ray reads "
                f"({' '.join(str(exc).split())[:200]}); move it aside to start the batch again"
            ) from None
        if info.version > BATCH_JSON_VERSION:
            raise JobJsonError(
                f"{folder.join('batch.json')}: version {info.version} is newer than this "
                f"car-ray reads ({BATCH_JSON_VERSION}); upgrade car-ray"
            )
        return info
