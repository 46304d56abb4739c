"""The job's output under faults a user meets: a second run on the same output, and a disk
that fills mid-job. Each ends in one line that says what to do, and nothing written is lost."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as pads
import pytest
from typer.testing import CliRunner

from car_ray.cli import app
from car_ray.job import load_job
from car_ray.results import ForkSink, JobBusy, _output, _parquet, hold_job
from car_ray.schedule import job_id_of
from car_ray.tape import load_tape

from .conftest import ROOT, support_job_file

# Takes the job's lock as a run does, says so, and keeps it until it is killed.
HOLDER = """
import sys, time
from car_ray.results import hold_job
with hold_job(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_a_second_run_on_the_same_output_is_refused_naming_the_holder(
    tmp_path: Path, demo_tape_path: Path
) -> None:
    job_file = support_job_file(tmp_path / "job", demo_tape_path)
    out = tmp_path / "out"
    job_id = job_id_of(load_job(job_file), load_tape(demo_tape_path))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(out), job_id], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        second = subprocess.run(
            [sys.executable, "-m", "car_ray.cli", "attribute", str(job_file), "--out", str(out)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=100,
            check=False,
        )
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert second.returncode == 2, second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"{out / job_id} is in use by another run" in line
    assert f"pid {holder.pid} on {socket.gethostname()}" in line
    # The refused run wrote nothing: no job.json, no forks.
    assert sorted(p.name for p in (out / job_id).iterdir()) == ["run.lock"]

    # The lock died with its SIGKILLed holder: the next run takes it at once.
    busy = pytest.raises(JobBusy, match=f"pid {os.getpid()} on ")
    with hold_job(out, job_id), busy, hold_job(out, job_id):  # a second open: a second holder
        pass
    assert (out / job_id / "run.lock").read_text() == ""  # no stale holder to read


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("ray_local")
def test_a_full_disk_stops_the_job_in_one_line_and_the_same_command_resumes_it(
    tmp_path: Path, demo_tape_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_file = support_job_file(tmp_path / "job", demo_tape_path, max_forks="40")
    out = tmp_path / "out"
    job_id = job_id_of(load_job(job_file), load_tape(demo_tape_path))
    command = ["attribute", str(job_file), "--out", str(out)]

    # The disk fills once 15 rows are in the journal: no write reaches it after that.
    journaled = 0
    append, sync = _parquet._Journal.append, _output.sync_data

    def counted(self: _parquet._Journal, line: bytes) -> None:
        nonlocal journaled
        append(self, line)
        journaled += 1

    def filling(fd: int) -> None:
        if journaled >= 15:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        sync(fd)

    monkeypatch.setattr(_parquet._Journal, "append", counted)
    monkeypatch.setattr(_output, "sync_data", filling)
    full = CliRunner().invoke(app, command)
    monkeypatch.undo()

    assert full.exit_code == 2, full.output
    assert "Traceback" not in full.output
    (line,) = full.stderr.strip().splitlines()
    # Whichever write came first after the disk filled: the journal, job.json or a part.
    assert re.fullmatch(
        rf"error: cannot write {re.escape(str(out / job_id))}/"
        r"(forks/_journal\.jsonl|job\.json|forks/part-\S+\.parquet): No space left on device\. "
        r"What the job wrote before is kept; run the same command again once there is room to "
        r"resume the job\.",
        line,
    ), line
    rows = ForkSink.existing(out, job_id).to_pylist()
    assert len(rows) == 15
    # What was spent stays recorded: the last job.json counts every fork it wrote as spent
    # or reserved (a reservation bounds a fork's spend from above).
    info = json.loads((out / job_id / "job.json").read_text())
    spent, reserved = info["ledger"]["spent"], info["ledger"]["reserved"]
    assert spent["forks"] + reserved["forks"] >= len(rows)
    assert spent["usd"] + reserved["usd"] >= sum(r["cost_usd"] for r in rows)

    again = CliRunner().invoke(app, command)
    assert again.exit_code == 0, again.output
    after = pads.dataset(out / job_id / "forks", format="parquet").to_table().to_pylist()
    ids = [r["task_id"] for r in after]
    assert len(ids) == len(set(ids)), "a fork was written twice"
    assert {r["task_id"] for r in rows} <= set(ids), "a row taken before the disk filled is gone"
    assert not (out / job_id / "forks" / "_journal.jsonl").exists()
    final = json.loads((out / job_id / "job.json").read_text())
    assert final["runs"] == 2 and final["resumed_rows"] == len(rows)
    assert len(rows) <= final["ledger"]["spent"]["forks"] <= 40
