"""Recording in production: `recording(folder)` records each run of an agent function to its
own tape with a mark beside it; `failing_tapes(folder)` lists the runs marked failed, for
`car-ray batch --from FOLDER`."""

from __future__ import annotations

from ._marks import (
    MARK_SUFFIX,
    MarkedBy,
    MarkedTape,
    MarkStatus,
    RunMark,
    failing_tapes,
    mark_path,
    mark_tape,
    marked_tapes,
    read_mark,
)
from ._recording import (
    AsyncRecordedAgent,
    RecordedRun,
    Recording,
    SyncRecordedAgent,
    provider_base_urls,
    recording,
)

__all__ = [
    "MARK_SUFFIX",
    "AsyncRecordedAgent",
    "MarkStatus",
    "MarkedBy",
    "MarkedTape",
    "RecordedRun",
    "Recording",
    "RunMark",
    "SyncRecordedAgent",
    "failing_tapes",
    "mark_path",
    "mark_tape",
    "marked_tapes",
    "provider_base_urls",
    "read_mark",
    "recording",
]
