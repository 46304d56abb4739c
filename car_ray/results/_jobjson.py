"""`<out>/<job_id>/job.json`: the job's request, status, spend, timings and versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ._parquet import JobDir


def write_job_json(out: str | Path, job_id: str, data: dict[str, Any]) -> str:
    """Write `data` as pretty JSON to `<out>/<job_id>/job.json`, replacing it atomically (a
    reader sees the old file or the new one, never a mix); returns its path."""
    try:
        text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"job.json of job {job_id!r}: {exc} (give plain JSON values: str, number, bool, "
            "None, list, dict; no NaN)"
        ) from None
    job = JobDir.of(out, job_id)
    job.make_dir()
    job.write_atomic((text + "\n").encode("utf-8"), "job.json")
    return job.join("job.json")


def read_job_json(out: str | Path, job_id: str) -> dict[str, Any] | None:
    """The job's `job.json` as a dict, or None if the job has not written one."""
    job = JobDir.of(out, job_id)
    data = job.read_bytes("job.json")
    if data is None:
        return None
    try:
        value = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{job.join('job.json')}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{job.join('job.json')}: expected a JSON object, got {type(value)}")
    return value
