"""Job output readable without car-ray: fork rows as a Parquet dataset, the attribution table,
and `job.json`, each file written whole (a local one under a temporary name and renamed, an
object in one PUT), to a local folder or any pyarrow filesystem URI."""

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
from ._lock import Held, JobBusy, hold_job
from ._output import (
    FoundJob,
    JobDir,
    OutputError,
    find_jobs,
    has_job,
    is_uri,
    job_location,
    shown,
    split_job_location,
    writing,
)
from ._parquet import ForkSink, read_attribution, write_attribution
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
    "FoundJob",
    "Held",
    "JobBusy",
    "JobDir",
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
    "find_jobs",
    "fork_record",
    "has_job",
    "hold_job",
    "is_uri",
    "job_location",
    "read_attribution",
    "shown",
    "split_job_location",
    "top_cause",
    "verdict",
    "write_attribution",
    "writing",
]
