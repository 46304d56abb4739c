"""Where a job's files live: a local folder, or any pyarrow filesystem URI (`s3://bucket/prefix`,
`gs://...`, `file:///...`), resolved with `pyarrow.fs.FileSystem.from_uri`.

A location is a string: a path, or a URI whose query (`?endpoint_override=...`) stays at its
end; `job_location` and `split_job_location` go between `<out>` and `<out>/<job_id>`, `shown`
is what messages print (never a query or credentials)."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs


class OutputError(RuntimeError):
    """The job's output cannot be written (a full or read-only disk) or another run holds it;
    the message names the path and says what to do."""


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})
_READ_ONLY = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


@contextlib.contextmanager
def reaching(path: str, *, write: bool = False) -> Iterator[None]:
    """Turn a remote filesystem's error (unreachable, refused, no such bucket) met at `path`
    into an `OutputError` in one line (a write's says the job resumes); a missing file
    passes."""
    try:
        yield
    except FileNotFoundError:
        raise
    except OSError as exc:
        then = (
            "What the job wrote before is kept (rows not yet on the output stay in this "
            "machine's staging journal); run the same command again once the output is "
            "reachable to resume the job."
            if write
            else "Check the URI, the endpoint (AWS_ENDPOINT_URL or ?endpoint_override=) and "
            "the credentials in the environment."
        )
        raise OutputError(f"cannot reach {path}: {' '.join(str(exc).split())}. {then}") from exc


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


# `=` too: a batch's trace folders are hive partitions (`trace=<id>`).
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]*$")
# Filesystems whose files are objects: a write is one whole object (a PUT), visible whole or
# not at all, and there is no rename (a move is a copy and a delete).
_OBJECT_STORES = frozenset({"s3", "gcs"})


def is_uri(location: str | Path) -> bool:
    """Whether `location` is a filesystem URI rather than a plain path."""
    return isinstance(location, str) and "://" in location


def job_location(out: str | Path, job_id: str) -> str:
    """`<out>/<job_id>`: a path, or a URI with the job id at the end of its path."""
    if not is_uri(out):
        return os.path.join(out, job_id)
    parts = urlsplit(str(out))
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{job_id}"))


def split_job_location(folder: str | Path) -> tuple[str, str]:
    """`(out, job_id)` of a job's folder (`job_location`'s inverse)."""
    if not is_uri(folder):
        out, job_id = os.path.split(os.path.abspath(folder))
        return out, job_id
    parts = urlsplit(str(folder))
    out, _, job_id = parts.path.rstrip("/").rpartition("/")
    return urlunsplit(parts._replace(path=out)), job_id


def shown(location: str | Path) -> str:
    """`location` as messages and logs print it: a URI without its query or any user info
    (an endpoint or credentials are the environment's, never the output's name)."""
    if not is_uri(location):
        return str(location)
    parts = urlsplit(str(location))
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _check_uri(uri: str) -> None:
    parts = urlsplit(uri)
    if "@" in parts.netloc:
        raise ValueError(
            f"{shown(uri)}: the output URI carries credentials (user:secret@); they would "
            "show in process lists, job metadata and logs. Give them in the environment "
            "instead (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN or "
            "AWS_PROFILE for s3://)"
        )


@functools.lru_cache(maxsize=32)
def _filesystem(uri: str, endpoint: str | None) -> tuple[pafs.FileSystem, str]:
    # One filesystem per output (and endpoint) in a process: from_uri may ask S3 for the
    # bucket's region, and job.json is written every second.
    del endpoint  # part of the cache key only: pyarrow reads AWS_ENDPOINT_URL itself
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    _check_uri(uri)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    try:
        return _filesystem(uri, endpoint)
    except (OSError, ValueError) as exc:
        message = str(exc).replace(uri, shown(uri))
        raise OutputError(
            f"{shown(uri)}: cannot open this output: {message}. Check the URI, the endpoint "
            "(AWS_ENDPOINT_URL or ?endpoint_override=) and the credentials in the environment"
        ) from None


@dataclass(frozen=True)
class JobDir:
    """`<out>/<job_id>` on its filesystem. Local folders get fsync + `os.replace`; an object
    store (s3, gcs) gets each file as one whole object; any other filesystem a file written
    under a temporary name then moved, as atomic as that filesystem's move."""

    fs: pafs.FileSystem
    path: str
    local: bool

    @classmethod
    def of(cls, out: str | Path, job_id: str) -> JobDir:
        if not _JOB_ID.match(job_id):
            raise ValueError(
                f"job id {job_id!r}: use letters, digits, '.', '_', '=' or '-', not starting with "
                "'.' or '-' (it names a folder)"
            )
        if is_uri(out):
            fs, base = _from_uri(str(out))
            if isinstance(fs, pafs.LocalFileSystem):
                return cls(fs, str(Path(base) / job_id), local=True)
            return cls(fs, f"{base.rstrip('/')}/{job_id}".lstrip("/"), local=False)
        return cls(pafs.LocalFileSystem(), str(Path(out).absolute() / job_id), local=True)

    @property
    def whole_objects(self) -> bool:
        """Whether a file is written as one object (no rename there)."""
        return self.fs.type_name in _OBJECT_STORES

    def join(self, *names: str) -> str:
        return "/".join([self.path, *names])

    def make_dir(self, *names: str) -> None:
        path = self.join(*names)
        if not self.local:
            if not self.whole_objects:  # an object store has no folders to make
                self.fs.create_dir(path, recursive=True)
            return
        created = not os.path.isdir(path)
        with writing(path):
            os.makedirs(path, exist_ok=True)
            if created:
                # The new folder's own entry must survive a crash too, not only its files.
                fsync_dir(os.path.dirname(path))

    def files(self, *names: str) -> list[str]:
        """Base names of the files in a folder (empty if it does not exist), sorted."""
        selector = pafs.FileSelector(self.join(*names), allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def info(self, *names: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self.join(*names))

    def read_bytes(self, *names: str) -> bytes | None:
        path = self.join(*names)
        if self.local:
            try:
                return Path(path).read_bytes()
            except FileNotFoundError:
                return None
        return _read(self.fs, path, path)

    def remove(self, *names: str) -> None:
        self.fs.delete_file(self.join(*names))

    def write_atomic(self, data: bytes | memoryview, *names: str) -> None:
        """Write the file whole: readers never see a partial file under the final name. A
        local file goes to `.<name>.<uuid>.tmp` in the same folder, synced, then renamed; an
        object is one PUT (what car-ray writes is under the 10 MB at which pyarrow splits an
        upload in parts, and a split one appears only once every part is in)."""
        final = self.join(*names)
        if self.whole_objects:
            # One write of all the bytes, then close: an upload that failed is never
            # completed, so no half object appears under `final`.
            with reaching(final, write=True), self.fs.open_output_stream(final) as stream:
                stream.write(data)
            return
        folder, name = final.rsplit("/", 1)
        if self.local:
            with writing(final):
                write_whole(final, data, sync=True)
            fsync_dir(folder)
            return
        temp = f"{folder}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            with self.fs.open_output_stream(temp) as stream:
                stream.write(data)
            self.fs.move(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(temp)
            raise


def write_whole(path: str | Path, data: bytes | memoryview | str, *, sync: bool) -> None:
    """Write a local file whole: to `.<name>.<random>.tmp` beside it (synced if `sync`), then
    renamed over `path`, so no reader sees a part of it; the temporary file is removed if
    anything fails. The job's files, a run's mark and the report page all go this way."""
    folder, name = os.path.split(os.fspath(path))
    temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(temp, "xb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if sync:
                f.flush()
                sync_data(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def sync_data(fd: int) -> None:
    """Make a file's written bytes durable: the one place data reaches the disk (fdatasync
    where there is one: the file's size is synced, its times need not be)."""
    getattr(os, "fdatasync", os.fsync)(fd)


def fsync_dir(path: str) -> None:
    """Make a folder's entries (a file created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_root() -> str:
    """This machine's local folder for what a remote location needs on disk: `CAR_RAY_STAGING`,
    else `$XDG_CACHE_HOME/car-ray/staging` (`~/.cache/...`)."""
    return os.environ.get("CAR_RAY_STAGING") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "car-ray", "staging"
    )


def staging_folder(job: JobDir) -> str:
    """The local folder that holds a remote job's journal (rows not yet in a part): under
    `staging_root()`, named by the job id and a digest of where its output is."""
    where = hashlib.sha256(f"{job.fs.type_name}:{job.path}".encode()).hexdigest()[:12]
    return os.path.join(staging_root(), f"{os.path.basename(job.path)}-{where}")


def open_location(location: str | Path) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a folder or file given as a local path or a URI (the
    URI's credentials refused, its errors one line: `OutputError`)."""
    if is_uri(location):
        return _from_uri(str(location))
    return pafs.LocalFileSystem(), str(Path(location).absolute())


def read_location(location: str) -> bytes | None:
    """The bytes of the file at a path or URI; None when there is no such file."""
    fs, path = open_location(location)
    return _read(fs, path, shown(location))


def _read(fs: pafs.FileSystem, path: str, named: str) -> bytes | None:
    """A whole file of `fs`, None when it does not exist; a store that does not answer is an
    `OutputError` naming `named`."""
    try:
        with reaching(named), fs.open_input_stream(path) as stream:
            data: bytes = stream.read()
            return data
    except FileNotFoundError:
        return None


def location_name(location: str) -> str:
    """The file name at the end of a path or URI (a URI's query left out)."""
    if is_uri(location):
        return urlsplit(location).path.rstrip("/").rpartition("/")[2]
    return Path(location).name


def list_location(folder: str) -> list[str] | None:
    """The names of the files in a folder at a path or URI (not its subfolders), sorted; None
    when the folder does not exist (on an object store: holds nothing)."""
    fs, path = open_location(folder)
    selector = pafs.FileSelector(path.rstrip("/") or "/", allow_not_found=True)
    with reaching(shown(folder)):
        infos = fs.get_file_info(selector)
    if not infos and fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)


def staged_copy(uri: str) -> Path:
    """A local copy of the file at `uri` (a tape a batch reads from an object store), under
    `staging_root()/inputs`, fetched anew each time; `FileNotFoundError` naming the URI when
    there is no such file."""
    data = read_location(uri)
    if data is None:
        raise FileNotFoundError(f"{shown(uri)}: no such file")
    digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
    local = Path(staging_root()) / "inputs" / digest / location_name(uri)
    local.parent.mkdir(parents=True, exist_ok=True)
    write_whole(local, data, sync=False)
    return local


@dataclass(frozen=True)
class FoundJob:
    """A job folder under an output, and when its job.json was last written (None: unknown)."""

    folder: str
    mtime_s: float | None


def has_job(folder: str | Path) -> bool:
    """Whether `folder` (a path or a URI) is a job's output: it holds a job.json."""
    if not is_uri(folder):
        return os.path.isfile(os.path.join(folder, "job.json"))
    _check_uri(str(folder))  # credentials in it are refused, not taken for no job
    out, job_id = split_job_location(folder)
    try:
        job = JobDir.of(out, job_id)
    except ValueError:  # not a job id: not a job's folder
        return False
    with reaching(shown(folder)):
        found: bool = job.info("job.json").type == pafs.FileType.File
    return found


def find_jobs(out: str | Path, prefix: str) -> list[FoundJob]:
    """The job folders under `out` whose name starts with `prefix`, oldest job.json first."""
    fs, base = open_location(out)
    selector = pafs.FileSelector(base.rstrip("/") or "/", allow_not_found=True)
    try:
        names = [
            i.base_name
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.Directory and i.base_name.startswith(prefix)
        ]
    except (OSError, ValueError):
        return []
    found = []
    for info in fs.get_file_info([f"{base.rstrip('/')}/{n}/job.json" for n in names]):
        if info.type == pafs.FileType.File:
            job_id = info.path.rstrip("/").split("/")[-2]
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            found.append(FoundJob(job_location(out, job_id), mtime))
    return sorted(found, key=lambda f: (f.mtime_s or 0.0, f.folder))
