"""Job output readable without car-ray: fork rows as a Parquet dataset, the attribution table,
and `job.json`, each file written whole under a temporary name and renamed."""

from __future__ import annotations

from ._jobjson import read_job_json, write_job_json
from ._lock import JobBusy, hold_job
from ._parquet import (
    ATTRIBUTION_SCHEMA,
    FORK_SCHEMA,
    ForkSink,
    OutputError,
    SchemaError,
    Stage,
    StepKind,
    fork_record,
    read_attribution,
    write_attribution,
    writing,
)
from ._verdict import describe_entry, describe_step, top_cause, verdict

__all__ = [
    "ATTRIBUTION_SCHEMA",
    "FORK_SCHEMA",
    "ForkSink",
    "JobBusy",
    "OutputError",
    "SchemaError",
    "Stage",
    "StepKind",
    "describe_entry",
    "describe_step",
    "fork_record",
    "hold_job",
    "read_attribution",
    "read_job_json",
    "top_cause",
    "verdict",
    "write_attribution",
    "write_job_json",
    "writing",
]
