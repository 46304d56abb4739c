"""Job output readable without car-ray: fork rows as a Parquet dataset, the attribution table,
and `job.json`, each file written whole under a temporary name and renamed."""

from __future__ import annotations

from ._jobjson import read_job_json, write_job_json
from ._parquet import (
    ATTRIBUTION_SCHEMA,
    FORK_SCHEMA,
    ForkSink,
    SchemaError,
    Stage,
    StepKind,
    fork_record,
    write_attribution,
)

__all__ = [
    "ATTRIBUTION_SCHEMA",
    "FORK_SCHEMA",
    "ForkSink",
    "SchemaError",
    "Stage",
    "StepKind",
    "fork_record",
    "read_job_json",
    "write_attribution",
    "write_job_json",
]
