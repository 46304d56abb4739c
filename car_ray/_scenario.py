"""Scenario jobs (a simulated policy beside the agent): their tapes, recorded on first use."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from ._aio import run as run_loop
from .job import Job, JobFileError
from .replay import BaseUrls, record
from .tape import Tape, load_tape


def ensure_tape(job: Job, on_record: Callable[[str], None] | None = None) -> Tape:
    """The job's tape, recorded first against the simulated provider (the job's policy and
    seed) when the file does not exist yet. The recording is written beside it under a dot
    name and linked into place whole, so processes that start on the same scenario at once
    (a benchmark's pool, two users) never read a tape still being written, and all of them
    use the one that was linked first (`_publish`)."""
    path = job.tape_path
    if path is None:
        raise JobFileError(f"{job.path}: key 'tape' is not set (where the recorded run lives)")
    if not path.exists():
        if job.spec.policy is None:
            raise JobFileError(
                f"{job.path}: the tape {path} does not exist and the job has no 'policy' to "
                "record it against: record it with `car-ray record`"
            )
        if on_record is not None:
            on_record(f"recording {job.spec.agent} → {path}")
        from .sim import SimServer

        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".recording")
        os.close(fd)
        partial = Path(name)

        async def go() -> None:
            with SimServer(job.load("policy")) as sim:
                await record(
                    job.load("agent"),
                    job.spec.agent,
                    job.spec.input,
                    partial,
                    base_urls=BaseUrls.for_server(sim.url),
                    seed=job.spec.seed,
                    overwrite=True,
                )

        try:
            run_loop(go())
            _publish(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return load_tape(path)


def _publish(partial: Path, path: Path) -> None:
    """Put a whole recording at `path` unless another process put one there first: a hard
    link fails when the name exists, so the first one linked stays. Where the filesystem has
    no hard links (FAT, some network and FUSE mounts), a rename: readers still never see a
    partial tape, and the last one renamed stays."""
    try:
        os.link(partial, path)
    except FileExistsError:
        pass
    except OSError:
        if not path.exists():
            os.replace(partial, path)
