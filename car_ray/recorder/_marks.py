"""Marks: what a recorded run's scorer or caller said about it, in a small JSON file beside
its tape (`<name>.tape` → `<name>.mark.json`), so that a batch picks only the failing runs.

A tape is sealed when its run ends and never changes after; a mark can come later (a
customer complains an hour after the answer), so it lives beside the tape, not in it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..results._output import write_whole
from ..tape import ToolError

TAPE_SUFFIX = ".tape"
MARK_SUFFIX = ".mark.json"

# failed: the scorer said bad (>= 0.5), the caller marked it, or the agent raised.
# passed: the scorer said good, or the caller said so. unscored: no scorer and no caller mark,
# or the scorer itself failed (`reason` says how). aborted: the run was cancelled or
# interrupted (asyncio cancellation, Ctrl-C): its tape ends with that error, but it is not a
# failure of the agent's.
MarkStatus = Literal["failed", "passed", "unscored", "aborted"]
MarkedBy = Literal["scorer", "caller", "error"]


class RunMark(BaseModel):
    """One recorded run's mark, `<name>.mark.json` beside `<name>.tape`; written whole under
    a temporary name and renamed, so a reader sees the old mark or the new one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["car-ray-mark"] = "car-ray-mark"
    version: Literal[1] = 1
    tape: str  # the tape's file name, in the mark's folder
    tape_id: str  # the seal's digest: the id car-ray knows the tape by
    agent: str
    started: datetime  # when the run started (UTC)
    status: MarkStatus
    score: float | None = None  # the scorer's value in [0, 1], 1 the bad outcome
    reason: str | None = None
    marked_by: MarkedBy | None = None
    error: ToolError | None = None  # what the agent raised, as the tape's seal has it

    @property
    def failing(self) -> bool:
        return self.status == "failed"


def mark_path(tape: Path) -> Path:
    """`<name>.mark.json` for `<name>.tape`."""
    name = tape.name.removesuffix(TAPE_SUFFIX)
    return tape.with_name(name + MARK_SUFFIX)


def write_mark(folder: Path, mark: RunMark, *, fsync: bool = True) -> Path:
    """Write `mark` beside its tape: whole, fsynced (unless not), then renamed over the old
    one."""
    final = mark_path(folder / mark.tape)
    data = mark.model_dump_json(exclude_none=True, indent=1).encode() + b"\n"
    write_whole(final, data, sync=fsync)
    return final


def read_mark(tape: Path) -> RunMark | None:
    """The mark of `tape`, None if it has none yet; `ValueError` naming the file if the mark
    cannot be read."""
    path = mark_path(tape)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse_mark(data, str(path))


def parse_mark(data: bytes, where: str) -> RunMark:
    """A mark's bytes read from `where` (a file or a URI); `ValueError` naming it otherwise."""
    try:
        return RunMark.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "the file"
        raise ValueError(
            f"{where}: not a car-ray mark ({key}: {first['msg']}); delete it and mark the "
            f"run again (car_ray.recorder.mark_tape), or move it out of the folder"
        ) from None


def mark_tape(tape: str | os.PathLike[str], *, failed: bool, reason: str | None = None) -> RunMark:
    """The caller's word on a finished recorded run, which replaces the scorer's: `failed`
    puts the tape among `failing_tapes`. The run must have ended (its first mark written)."""
    path = Path(tape)
    mark = read_mark(path)
    if mark is None:
        raise ValueError(
            f"{path}: no mark beside it ({mark_path(path).name}): the run has not ended, was "
            "killed before it did, or this is not a tape car_ray.recording wrote"
        )
    updated = mark.model_copy(
        update={
            "status": "failed" if failed else "passed",
            "reason": reason,
            "marked_by": "caller",
        }
    )
    write_mark(path.parent, updated)
    return updated


@dataclass(frozen=True)
class MarkedTape:
    """A tape in a recording folder and its mark (None with `problem`: the run is still
    going, was killed before its end, or its mark cannot be read)."""

    tape: Path
    mark: RunMark | None
    problem: str | None = None


def marked_tapes(
    folder: str | os.PathLike[str], *, since: datetime | None = None
) -> list[MarkedTape]:
    """Every tape in `folder` (not its subfolders) with its mark, oldest first; `since` keeps
    the runs started at or after it (a timezone-aware time). A mark that cannot be read is
    reported in `problem`, never raised: one bad file does not stop a night's batch."""
    if since is not None and since.utcoffset() is None:
        raise ValueError(
            f"since={since.isoformat()} has no timezone: marks are in UTC; give an aware "
            "time, e.g. datetime.now(UTC) - timedelta(days=1)"
        )
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(
            f"{root}: no such folder (give the folder car_ray.recording writes its tapes to)"
        )
    found: list[MarkedTape] = []
    for tape in sorted(root.glob("*" + TAPE_SUFFIX)):
        if tape.name.startswith("."):
            continue
        try:
            mark = read_mark(tape)
        except ValueError as exc:
            found.append(MarkedTape(tape, None, str(exc)))
            continue
        if mark is None:
            found.append(MarkedTape(tape, None, "no mark: the run is still going or was killed"))
        elif since is None or mark.started >= since:
            found.append(MarkedTape(tape, mark))
    return found


def failing_tapes(folder: str | os.PathLike[str], *, since: datetime | None = None) -> list[Path]:
    """The tapes in `folder` whose runs are marked failed (by the scorer, by the caller, or
    because the agent raised), oldest first: what `car-ray batch --from FOLDER` attributes.

    Runs marked passed, unscored or aborted are left out, and so are tapes without a mark
    (a run still going, or killed before it ended: its tape is incomplete)."""
    return [
        entry.tape
        for entry in marked_tapes(folder, since=since)
        if entry.mark is not None and entry.mark.failing
    ]
