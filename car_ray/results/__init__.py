"""Job output readable without car-ray: fork rows as a Parquet dataset, the attribution table,
and `job.json`, each file written whole under a temporary name and renamed."""

from __future__ import annotations

from ._jobjson import (
    JOB_JSON_VERSION,
    Caps,
    JobInfo,
    JobJsonError,
    Ledger,
    ProgressInfo,
    RayInfo,
    Spend,
    StageTime,
    TapeRef,
)
from ._lock import JobBusy, hold_job
from ._parquet import ForkSink, OutputError, read_attribution, write_attribution, writing
from ._rows import (
    ATTRIBUTION_SCHEMA,
    FORK_SCHEMA,
    AttributionRow,
    ForkRecord,
    SchemaError,
    Stage,
    StepKind,
    arrow_schema,
    fork_record,
)
from ._verdict import describe_entry, describe_step, top_cause, verdict

__all__ = [
    "ATTRIBUTION_SCHEMA",
    "FORK_SCHEMA",
    "JOB_JSON_VERSION",
    "AttributionRow",
    "Caps",
    "ForkRecord",
    "ForkSink",
    "JobBusy",
    "JobInfo",
    "JobJsonError",
    "Ledger",
    "OutputError",
    "ProgressInfo",
    "RayInfo",
    "SchemaError",
    "Spend",
    "Stage",
    "StageTime",
    "StepKind",
    "TapeRef",
    "arrow_schema",
    "describe_entry",
    "describe_step",
    "fork_record",
    "hold_job",
    "read_attribution",
    "top_cause",
    "verdict",
    "write_attribution",
    "writing",
]
