"""One run per job output: an exclusive OS lock on `<out>/<job_id>/run.lock` on a local folder,
a lease object of the same name on any other filesystem (an object store has no lock)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from ._output import JobDir, OutputError, writing

LOCK_FILE = "run.lock"
# A remote lease: renewed every LEASE_S / 3; a lease not renewed for LEASE_S (by the reader's
# clock, against the holder's) is a dead holder's. Two runs that both write the lock object
# within SETTLE_S of each other: the one whose write landed last holds it, the other sees so
# when it reads it back and stops.
LEASE_S = 30.0
SETTLE_S = 1.0

log = structlog.get_logger("car_ray.results")


class JobBusy(OutputError):
    """Another run holds the job's output; the message names its pid and host."""


class Held:
    """What `hold_job` gives the block: `check()` raises `JobBusy` once the output is no
    longer this run's (a remote lease taken over while this run could not renew it)."""

    def __init__(self) -> None:
        self.lost: str | None = None

    def check(self) -> None:
        if self.lost is not None:
            raise JobBusy(self.lost)


@contextmanager
def hold_job(out: str | Path, job_id: str) -> Iterator[Held]:
    """Hold the job's output for the block; `JobBusy` at once if another run holds it.

    On a local folder: `fcntl.flock` on `run.lock` (its holder's pid and host written in it);
    the OS drops it with its holder, so a killed run leaves no stale lock. Elsewhere (s3://,
    ...): a lease object `run.lock` naming an owner id, pid and host, renewed in a thread.
    A lease is free when it is absent, expired, or its holder is a process of this host that
    is gone. What a lease does not guarantee (there is no compare-and-swap through pyarrow):
    two runs started within `SETTLE_S` of each other that both miss the other's write, or a
    holder paused past `LEASE_S` whose lease is taken over, may both write for a moment (a
    fork then run twice, its task id in two parts); the paused one stops at its next part
    (`Held.check`)."""
    job = JobDir.of(out, job_id)
    if not job.local:
        with _lease(job) as held:
            yield held
        return
    job.make_dir()
    path = job.join(LOCK_FILE)
    with writing(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobBusy(_busy(job.path, _holder(fd))) from None
        with writing(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(_me()) + "\n").encode(), 0)
        try:
            yield Held()
        finally:
            # Not the next holder's to read: a waiting run would name a process that is gone.
            # (On a disk that went read-only, keep the error that stopped the job.)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def _me() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _busy(where: str, holder: str) -> str:
    return (
        f"{where} is in use by another run of this job ({holder}); wait for it to end or "
        "stop it, then run this command again: it resumes the job"
    )


def _named(holder: dict[str, Any]) -> str:
    return f"pid {holder['pid']} on {holder['host']}, since {holder['since']}"


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote (it writes just after it locks: wait a little)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            return _named(json.loads(os.pread(fd, 4096, 0)))
        except (ValueError, KeyError, TypeError):
            if time.monotonic() > deadline:
                return "its pid and host not yet written"
            time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# The lease on a remote output.


def _read_lease(job: JobDir) -> dict[str, Any] | None:
    data = job.read_bytes(LOCK_FILE)
    if not data:
        return None
    try:
        lease = json.loads(data)
        return lease if isinstance(lease, dict) and "owner" in lease else None
    except ValueError:
        return None  # not a lease this car-ray wrote: taken over


def _live(lease: dict[str, Any]) -> bool:
    """Whether the lease's holder may still be running."""
    try:
        if time.time() > float(lease["expires"]):
            return False
        if lease.get("host") == socket.gethostname():
            os.kill(int(lease["pid"]), 0)  # a process of this host that is gone holds nothing
    except ProcessLookupError:
        return False
    except (KeyError, TypeError, ValueError, PermissionError):
        pass  # another user's process is alive
    return True


@contextmanager
def _lease(job: JobDir) -> Iterator[Held]:
    lease_s = LEASE_S
    where = job.join(LOCK_FILE)
    mine = {"owner": uuid.uuid4().hex, **_me(), "lease_s": lease_s}

    def write() -> None:
        job.write_atomic(json.dumps({**mine, "expires": time.time() + lease_s}).encode(), LOCK_FILE)

    current = _read_lease(job)
    if current is not None and _live(current):
        raise JobBusy(_busy(job.path, _named(current)))
    write()
    time.sleep(SETTLE_S)
    current = _read_lease(job)
    if current is None or current["owner"] != mine["owner"]:
        other = _named(current) if current else "it removed the lock as this run took it"
        raise JobBusy(_busy(job.path, other))

    held = Held()
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(lease_s / 3):
            try:
                current = _read_lease(job)
                if current is None or current["owner"] != mine["owner"]:
                    taker = _named(current) if current else "the lock was removed"
                    held.lost = _busy(job.path, taker) + (
                        f" (this run could not renew its lease on {where} in time: it "
                        "stops writing rows)"
                    )
                    log.error("output_lease_lost", lock=where)
                    return
                write()
            except (OSError, OutputError) as exc:  # OutputError: the store did not answer
                # The lease runs on: a later renewal may get through before it expires.
                log.warning("output_lease_not_renewed", lock=where, error=str(exc))

    thread = threading.Thread(target=renew, name="car-ray-lease", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()
        with contextlib.suppress(OSError, OutputError):
            current = _read_lease(job)
            if current is not None and current["owner"] == mine["owner"]:
                job.remove(LOCK_FILE)
