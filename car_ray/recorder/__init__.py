"""Recording in production: `recording(folder)` records each run of an agent function to its
own tape with a mark beside it; `failing_tapes(folder)` lists the runs marked failed, for
`car-ray batch --from FOLDER`; `read_manifest(folder)` what its manifest says of each tape
(priority, planted cause)."""

from __future__ import annotations

from ._manifest import (
    MANIFEST_NAME,
    ManifestEntry,
    ManifestError,
    manifest_path,
    parse_manifest,
    read_manifest,
    write_manifest,
)
from ._marks import (
    MARK_SUFFIX,
    TAPE_SUFFIX,
    MarkedBy,
    MarkedTape,
    MarkStatus,
    RunMark,
    failing_tapes,
    mark_path,
    mark_tape,
    marked_tapes,
    parse_mark,
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
    "MANIFEST_NAME",
    "MARK_SUFFIX",
    "TAPE_SUFFIX",
    "AsyncRecordedAgent",
    "ManifestEntry",
    "ManifestError",
    "MarkStatus",
    "MarkedBy",
    "MarkedTape",
    "RecordedRun",
    "Recording",
    "RunMark",
    "SyncRecordedAgent",
    "failing_tapes",
    "manifest_path",
    "mark_path",
    "mark_tape",
    "marked_tapes",
    "parse_manifest",
    "parse_mark",
    "provider_base_urls",
    "read_manifest",
    "read_mark",
    "recording",
    "write_manifest",
]
