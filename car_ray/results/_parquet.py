"""Fork rows and attribution tables as Parquet, one explicit schema each (derived from the row
models in `_rows`), written atomically."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import structlog

from . import _output
from ._output import JobDir, OutputError, fsync_dir, staging_folder, writing
from ._rows import ATTRIBUTION_ROWS, FORK_ROWS, FORK_SCHEMA, RowShape, SchemaError

__all__ = ["ForkSink", "JobDir", "OutputError", "read_attribution", "write_attribution", "writing"]

log = structlog.get_logger("car_ray.results")


# ---------------------------------------------------------------------------------------------
# Where a job's files live (`_output`): a local folder (os-level fsync and rename) or any
# pyarrow filesystem URI; a remote job's journal stays on local disk (`staging_folder`).

_TEMP = re.compile(r"^\..+\.tmp$")
_PART = re.compile(r"^part-(\d+)-[0-9a-f]+\.parquet$")


def _parquet_bytes(table: pa.Table) -> memoryview:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return memoryview(sink.getvalue())


def _read_parts(job: JobDir, columns: list[str] | None = None) -> pa.Table:
    names = [n for n in job.files("forks") if not n.startswith(".") and n.endswith(".parquet")]
    parts = sorted(names, key=lambda n: (int(m.group(1)) if (m := _PART.match(n)) else 0, n))
    if not parts:
        empty = FORK_SCHEMA.empty_table()
        return empty.select(columns) if columns is not None else empty
    dataset = pads.dataset(
        [job.join("forks", n) for n in parts],
        schema=FORK_SCHEMA,
        format="parquet",
        filesystem=job.fs,
    )
    return dataset.to_table(columns=columns)


# ---------------------------------------------------------------------------------------------
# The journal: the rows `add` took that no part holds yet, each synced before `add` returns.

# A leading '_' keeps it out of every Parquet reader's way (pyarrow, Spark, `forks/*.parquet`).
_JOURNAL = "_journal.jsonl"


def journal_path(job: JobDir) -> str:
    """Where the job's journal is: `forks/_journal.jsonl` of a local job; for a job on a
    remote filesystem (no append, no fsync there) a file of the same name in its local
    staging folder, so a row is on this machine's disk when the sink takes it."""
    if job.local:
        return job.join("forks", _JOURNAL)
    return os.path.join(staging_folder(job), _JOURNAL)


def _read_journal(job: JobDir) -> bytes | None:
    if job.local:
        return job.read_bytes("forks", _JOURNAL)
    try:
        return Path(journal_path(job)).read_bytes()
    except FileNotFoundError:
        return None


def _journal_rows(data: bytes, path: str) -> tuple[list[dict[str, Any]], int]:
    """The journal's rows, and the length of the bytes that hold them. A torn last line was
    never acknowledged; so was a last line that is whole but unreadable (a crash can leave a
    line's later page on disk and not an earlier one): both are left out."""
    rows: list[dict[str, Any]] = []
    whole = data[: data.rfind(b"\n") + 1]
    lines = whole.splitlines(keepends=True)
    length = 0
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(FORK_ROWS.from_json(line))
            except ValueError as exc:  # SchemaError and json's errors alike
                if number == len(lines):
                    break
                raise SchemaError(
                    f"{path}, line {number}: {exc} (the journal of rows not yet in a part; "
                    "this car-ray cannot read it)"
                ) from None
        length += len(line)
    return rows, length


class _Journal:
    """The job's journal (`journal_path`): one JSON line per row, appended and synced, so a
    row is on disk when `ForkSink.add` returns; emptied once a part holds its rows."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        self.replayed, self._length = _journal_rows(data, path)
        # `_length`: what the file holds once a torn or unreadable last line is cut.
        self._torn = self._length != len(data)
        self._fd: int | None = None

    def append(self, line: bytes) -> None:
        with writing(self.path):
            fd = self._open()
            try:
                if self._torn:
                    os.ftruncate(fd, self._length)
                    self._torn = False
                view = memoryview(line)
                while view:
                    view = view[os.write(fd, view) :]
                _output.sync_data(fd)  # the one data sync (a test fills the disk there)
            except OSError:
                # A part of a line left here would glue itself to the next one: cut it off
                # now, or before the next append.
                self._torn = True
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, self._length)
                    self._torn = False
                raise
        self._length += len(line)

    def clear(self) -> None:
        """Forget every row (a part holds them now). Not synced: should the old lines come
        back after a crash, the next sink drops the rows a part holds."""
        if self._length == 0 and not self._torn:
            return
        with writing(self.path):
            os.ftruncate(self._open(), 0)
        self._length, self._torn = 0, False

    def close(self, *, staged: bool = False) -> None:
        """Close the file; remove it if it holds no row (and its folder, if `staged` and
        empty)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._length == 0:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            if staged:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(self.path))

    def _open(self) -> int:
        if self._fd is None:
            folder = os.path.dirname(self.path)
            if not os.path.isdir(folder):  # a staging folder, made on the first row
                with writing(folder):
                    os.makedirs(folder, exist_ok=True)
                fsync_dir(os.path.dirname(folder))
            created = not os.path.exists(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if created:
                # The file's entry in its folder must survive a crash too, not only its lines.
                fsync_dir(os.path.dirname(self.path))
        return self._fd


# ---------------------------------------------------------------------------------------------


class ForkSink:
    """Streams fork rows to `<out>/<job_id>/forks/part-<seq>-<uuid>.parquet`, one file per
    flush, each complete or absent; a task id already written is dropped, so resume is exact.

    A row is durable when `add` returns: it is appended to the journal and synced, and the
    journal is emptied once a part holds its rows; the next sink (or `existing`) reads what a
    killed one left there. One sink per job at a time. On a local folder the journal is
    `forks/_journal.jsonl`; `out` may also be a pyarrow filesystem URI (s3://, gs://, ...),
    where each part is one whole object and the journal stays on this machine's disk (its
    staging folder, `journal_path`): a row is on the output once its part is, at each flush,
    and a resume on this machine also gets the rows journaled since. `guard` is called
    before each part is written (a lease that raises once another run took the output).
    """

    def __init__(
        self,
        out: str | Path,
        job_id: str,
        *,
        flush_rows: int = 1000,
        flush_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        guard: Callable[[], None] | None = None,
    ) -> None:
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be at least 1, got {flush_rows}")
        self.job_id = job_id
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.duplicates_dropped = 0
        self.rows_written = 0
        self.parts_written = 0
        self._job = JobDir.of(out, job_id)
        self._clock = clock
        self._guard = guard
        self._lock = threading.Lock()
        self._buffer: list[dict[str, Any]] = []
        self._closed = False

        self._job.make_dir("forks")
        seq = 0
        for name in self._job.files("forks"):
            if _TEMP.match(name):
                # A writer killed between writing and renaming leaves its temporary file;
                # its rows were never visible, so they are simply run again.
                log.warning("removed_stale_temp_file", path=self._job.join("forks", name))
                self._job.remove("forks", name)
            elif part := _PART.match(name):
                seq = max(seq, int(part.group(1)))
        self._seq = seq
        written = _read_parts(self._job, ["task_id"]).column("task_id").to_pylist()
        self._seen: set[str] = set(written)
        self._journal = _Journal(journal_path(self._job))
        for record in self._journal.replayed:
            # A row can be in both when a sink was killed between a part and clearing the
            # journal: the part's copy counts.
            if record["task_id"] not in self._seen:
                self._seen.add(record["task_id"])
                self._buffer.append(record)
        self._existing = frozenset(self._seen)
        self._last_flush = clock()

    @property
    def path(self) -> str:
        """The `forks` folder, on the sink's filesystem."""
        return self._job.join("forks")

    @classmethod
    def existing(cls, out: str | Path, job_id: str) -> pa.Table:
        """Every fork row already written for the job, in its parts or its journal (an empty
        table if none), in write order. Reads only: the next sink compacts the journal."""
        job = JobDir.of(out, job_id)
        # The journal first: a row that moves from it into a part in between is then read
        # twice (and counted once), never missed.
        data = _read_journal(job)
        parts = _read_parts(job)
        if not data:
            return parts
        seen = set(parts.column("task_id").to_pylist())
        journaled = []
        for record in _journal_rows(data, journal_path(job))[0]:
            if record["task_id"] not in seen:
                seen.add(record["task_id"])
                journaled.append(record)
        return pa.concat_tables([parts, FORK_ROWS.table(journaled)])

    def existing_task_ids(self) -> frozenset[str]:
        """The task ids that were on disk when this sink opened: the forks a resumed job skips."""
        return self._existing

    def seen(self, task_id: str) -> bool:
        """Whether `add` would drop this task id: written before, or added to this sink."""
        return task_id in self._seen

    def add(self, row: Mapping[str, Any]) -> bool:
        """Check and journal one row (see `fork_record`): it is on this machine's disk when
        this returns. False if its task id was already written or added (counted in
        `duplicates_dropped`). Flushes when due; `OutputError` if the disk is full."""
        record = FORK_ROWS.normalize(row)
        if record["job_id"] != self.job_id:
            raise SchemaError(
                f"fork row (task_id={record['task_id']!r}): field 'job_id' is "
                f"{record['job_id']!r}, but this sink writes job {self.job_id!r}"
            )
        with self._lock:
            if self._closed:
                raise RuntimeError(f"the fork sink of job {self.job_id!r} is closed")
            accepted = record["task_id"] not in self._seen
            if accepted:
                # On disk before it counts: a full disk raises here, the row not taken.
                self._journal.append(FORK_ROWS.to_json(record))
                self._seen.add(record["task_id"])
                self._buffer.append(record)
            else:
                self.duplicates_dropped += 1
            if len(self._buffer) >= self.flush_rows or self._interval_passed():
                self._flush_locked()
        return accepted

    def maybe_flush(self) -> int:
        """Flush if `flush_interval_s` has passed since the last flush; rows written."""
        with self._lock:
            return self._flush_locked() if self._interval_passed() else 0

    def flush(self) -> int:
        """Write the buffered rows as one part file (none if the buffer is empty); rows written."""
        with self._lock:
            return self._flush_locked()

    def close(self) -> None:
        """Flush what is buffered; the sink takes no more rows, also if the flush fails (the
        journal keeps the rows for the next sink)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._flush_locked()
            finally:
                self._journal.close(staged=not self._job.local)

    def __enter__(self) -> ForkSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _interval_passed(self) -> bool:
        return self._clock() - self._last_flush >= self.flush_interval_s

    def _flush_locked(self) -> int:
        self._last_flush = self._clock()
        count = len(self._buffer)
        if count:
            if self._guard is not None:
                self._guard()  # the rows stay journaled for the run that holds the output
            data = _parquet_bytes(FORK_ROWS.table(self._buffer))
            name = f"part-{self._seq + 1:06d}-{uuid.uuid4().hex}.parquet"
            # On failure the rows stay buffered (and journaled): a later flush writes them.
            self._job.write_atomic(data, "forks", name)
            self._seq += 1
            self._buffer = []
            self.rows_written += count
            self.parts_written += 1
        self._journal.clear()
        return count


def write_rows(
    out: str | Path, folder: str, name: str, shape: RowShape, rows: Sequence[Mapping[str, Any]]
) -> str:
    """Write `<out>/<folder>/<name>` (a table of `shape`'s rows) whole, replacing any earlier
    one; returns its path. A misfit row is a `SchemaError` naming it."""
    records = [shape.normalize(r) for r in rows]
    job = JobDir.of(out, folder)
    job.make_dir()
    job.write_atomic(_parquet_bytes(shape.table(records)), name)
    return job.join(name)


def write_attribution(out: str | Path, job_id: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """Write `<out>/<job_id>/attribution.parquet` (`ATTRIBUTION_SCHEMA`, one row per step and
    intervention) atomically, replacing any earlier one; returns its path."""
    return write_rows(out, job_id, "attribution.parquet", ATTRIBUTION_ROWS, rows)


def read_rows(out: str | Path, folder: str, name: str) -> list[dict[str, Any]] | None:
    """`<out>/<folder>/<name>` (a table `write_rows` wrote) as rows, None if it is not there."""
    data = JobDir.of(out, folder).read_bytes(name)
    if data is None:
        return None
    rows: list[dict[str, Any]] = pq.read_table(pa.BufferReader(data)).to_pylist()
    return rows


def read_attribution(out: str | Path, job_id: str) -> list[dict[str, Any]] | None:
    """`<out>/<job_id>/attribution.parquet` as rows, or None if the job has not written it."""
    return read_rows(out, job_id, "attribution.parquet")
