"""One run per job output: an exclusive OS lock on `<out>/<job_id>/run.lock`."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from ._parquet import JobDir, OutputError, writing

LOCK_FILE = "run.lock"


class JobBusy(OutputError):
    """Another run holds the job's output; the message names its pid and host."""


@contextmanager
def hold_job(out: str | Path, job_id: str) -> Iterator[None]:
    """Hold `<out>/<job_id>/run.lock` for the block (`fcntl.flock`, exclusive), its holder's
    pid and host written in it; `JobBusy` at once if another run holds it. The OS drops the
    lock with its holder, so a killed run leaves no stale lock. Only a local folder is locked:
    on a pyarrow filesystem URI (s3://, ...) two runs of a job are not kept apart."""
    job = JobDir.of(out, job_id)
    if not job.local:
        yield
        return
    job.make_dir()
    path = job.join(LOCK_FILE)
    with writing(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobBusy(
                f"{job.path} is in use by another run of this job ({_holder(fd)}); wait for "
                "it to end or stop it, then run this command again: it resumes the job"
            ) from None
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        with writing(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        try:
            yield
        finally:
            # Not the next holder's to read: a waiting run would name a process that is gone.
            # (On a disk that went read-only, keep the error that stopped the job.)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote (it writes just after it locks: wait a little)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            holder = json.loads(os.pread(fd, 4096, 0))
            return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "its pid and host not yet written"
            time.sleep(0.05)
