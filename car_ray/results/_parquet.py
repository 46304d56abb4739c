"""Fork rows and attribution tables as Parquet, one explicit schema each (derived from the row
models in `_rows`), written atomically."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import structlog

from ._rows import ATTRIBUTION_ROWS, FORK_ROWS, FORK_SCHEMA, SchemaError

log = structlog.get_logger("car_ray.results")


class OutputError(RuntimeError):
    """The job's output cannot be written (a full or read-only disk) or another run holds it;
    the message names the path and says what to do."""


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
_READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


@contextlib.contextmanager
def writing(path: str) -> Iterator[None]:
    """Turn a full or read-only disk met while writing `path` into an `OutputError` that says
    so in one line; other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _NO_ROOM | _READ_ONLY:
            raise
        until = "there is room" if exc.errno in _NO_ROOM else "it is writable again"
        raise OutputError(
            f"cannot write {path}: {exc.strerror or exc}. What the job wrote before is kept; "
            f"run the same command again once {until} to resume the job."
        ) from exc


# ---------------------------------------------------------------------------------------------
# Where a job's files live: a local folder (os-level fsync and rename) or any pyarrow filesystem.

_TEMP = re.compile(r"^\..+\.tmp$")
_PART = re.compile(r"^part-(\d+)-[0-9a-f]+\.parquet$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


@dataclass(frozen=True)
class JobDir:
    """`<out>/<job_id>` on its filesystem. Local folders get fsync + `os.replace`; elsewhere a
    file is written under a temporary name then moved, as atomic as that filesystem's move."""

    fs: pafs.FileSystem
    path: str
    local: bool

    @classmethod
    def of(cls, out: str | Path, job_id: str) -> JobDir:
        if not _JOB_ID.match(job_id):
            raise ValueError(
                f"job id {job_id!r}: use letters, digits, '.', '_' or '-', not starting with "
                "'.' or '-' (it names a folder)"
            )
        if isinstance(out, str) and "://" in out:
            fs, base = _from_uri(out)
            if isinstance(fs, pafs.LocalFileSystem):
                return cls(fs, str(Path(base) / job_id), local=True)
            return cls(fs, f"{base.rstrip('/')}/{job_id}".lstrip("/"), local=False)
        return cls(pafs.LocalFileSystem(), str(Path(out).absolute() / job_id), local=True)

    def join(self, *names: str) -> str:
        return "/".join([self.path, *names])

    def make_dir(self, *names: str) -> None:
        path = self.join(*names)
        if not self.local:
            self.fs.create_dir(path, recursive=True)
            return
        created = not os.path.isdir(path)
        with writing(path):
            os.makedirs(path, exist_ok=True)
            if created:
                # The new folder's own entry must survive a crash too, not only its files.
                _fsync_dir(os.path.dirname(path))

    def files(self, *names: str) -> list[str]:
        """Base names of the files in a folder (empty if it does not exist), sorted."""
        selector = pafs.FileSelector(self.join(*names), allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def read_bytes(self, *names: str) -> bytes | None:
        path = self.join(*names)
        if self.local:
            try:
                return Path(path).read_bytes()
            except FileNotFoundError:
                return None
        if self.fs.get_file_info(path).type != pafs.FileType.File:
            return None
        with self.fs.open_input_stream(path) as stream:
            data: bytes = stream.read()
            return data

    def remove(self, *names: str) -> None:
        self.fs.delete_file(self.join(*names))

    def write_atomic(self, data: bytes | memoryview, *names: str) -> None:
        """Write the file whole under `.<name>.<uuid>.tmp` in the same folder, then rename it;
        readers never see a partial file under the final name."""
        final = self.join(*names)
        folder, name = final.rsplit("/", 1)
        temp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            if self.local:
                with writing(final):
                    with open(temp, "xb") as f:
                        f.write(data)
                        f.flush()
                        _sync_data(f.fileno())
                    os.replace(temp, final)
                _fsync_dir(folder)
            else:
                with self.fs.open_output_stream(temp) as stream:
                    stream.write(data)
                self.fs.move(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(temp)
            raise


def _sync_data(fd: int) -> None:
    """Make a file's written bytes durable: the one place data reaches the disk (fdatasync
    where there is one: the file's size is synced, its times need not be)."""
    getattr(os, "fdatasync", os.fsync)(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    """`forks/_journal.jsonl` of a local job: one JSON line per row, appended and synced, so a
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
                _sync_data(fd)
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

    def close(self) -> None:
        """Close the file; remove it if it holds no row."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._length == 0:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def _open(self) -> int:
        if self._fd is None:
            created = not os.path.exists(self.path)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if created:
                # The file's entry in its folder must survive a crash too, not only its lines.
                _fsync_dir(os.path.dirname(self.path))
        return self._fd


# ---------------------------------------------------------------------------------------------


class ForkSink:
    """Streams fork rows to `<out>/<job_id>/forks/part-<seq>-<uuid>.parquet`, one file per
    flush, each complete or absent; a task id already written is dropped, so resume is exact.

    On a local folder a row is durable when `add` returns: it is appended to
    `forks/_journal.jsonl` and synced, and the journal is emptied once a part holds its rows;
    the next sink (or `existing`) reads what a killed one left there. One sink per job at a
    time. `out` may also be a pyarrow filesystem URI (s3://, gs://, ...): there is no journal
    there (no append), rows are durable at each flush, a part as atomic as that filesystem's
    move."""

    def __init__(
        self,
        out: str | Path,
        job_id: str,
        *,
        flush_rows: int = 1000,
        flush_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
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
        self._journal: _Journal | None = None
        if self._job.local:
            self._journal = _Journal(self._job.join("forks", _JOURNAL))
            for record in self._journal.replayed:
                # A row can be in both when a sink was killed between a part and clearing
                # the journal: the part's copy counts.
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
        data = job.read_bytes("forks", _JOURNAL)
        parts = _read_parts(job)
        if not data:
            return parts
        seen = set(parts.column("task_id").to_pylist())
        journaled = []
        for record in _journal_rows(data, job.join("forks", _JOURNAL))[0]:
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
        """Check and journal one row (see `fork_record`): on a local folder it is on disk when
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
                if self._journal is not None:
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
                if self._journal is not None:
                    self._journal.close()

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
            data = _parquet_bytes(FORK_ROWS.table(self._buffer))
            name = f"part-{self._seq + 1:06d}-{uuid.uuid4().hex}.parquet"
            # On failure the rows stay buffered (and journaled): a later flush writes them.
            self._job.write_atomic(data, "forks", name)
            self._seq += 1
            self._buffer = []
            self.rows_written += count
            self.parts_written += 1
        if self._journal is not None:
            self._journal.clear()
        return count


def write_attribution(out: str | Path, job_id: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """Write `<out>/<job_id>/attribution.parquet` (`ATTRIBUTION_SCHEMA`, one row per step and
    intervention) atomically, replacing any earlier one; returns its path."""
    records = [ATTRIBUTION_ROWS.normalize(r) for r in rows]
    job = JobDir.of(out, job_id)
    job.make_dir()
    job.write_atomic(_parquet_bytes(ATTRIBUTION_ROWS.table(records)), "attribution.parquet")
    return job.join("attribution.parquet")


def read_attribution(out: str | Path, job_id: str) -> list[dict[str, Any]] | None:
    """`<out>/<job_id>/attribution.parquet` as rows, or None if the job has not written it."""
    data = JobDir.of(out, job_id).read_bytes("attribution.parquet")
    if data is None:
        return None
    rows: list[dict[str, Any]] = pq.read_table(pa.BufferReader(data)).to_pylist()
    return rows
