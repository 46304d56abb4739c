"""The attribution job end to end on the embedded Ray: what a user sees in the output."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.dataset as pads
import pytest

from car_ray.attribute import attribute
from car_ray.job import Job, load_job
from car_ray.results import ForkSink
from car_ray.schedule import job_id_of
from car_ray.tape import Tape

from .conftest import ROOT, SUPPORT_JOB, attribute_command, start_attribute, support_job_file

pytestmark = pytest.mark.usefixtures("ray_local")


def _rows(folder: str) -> list[dict[str, Any]]:
    return pads.dataset(os.path.join(folder, "forks"), format="parquet").to_table().to_pylist()


def _job(tmp_path: Path, tape: Tape, **overrides: Any) -> Job:
    """The demo job pointed at the session's tape, with settings overridden."""
    job = load_job(SUPPORT_JOB)
    spec = job.spec.model_copy(update=overrides)
    return Job(job.path, spec)


def read_job_json(out: Path, job_id: str) -> dict[str, Any] | None:
    """The job's job.json as a user reads it (None before the job wrote one)."""
    path = out / job_id / "job.json"
    return json.loads(path.read_text("utf-8")) if path.exists() else None


def test_the_demo_finds_the_injection_and_writes_readable_results(
    tmp_path: Path, support_tape: Tape
) -> None:
    job = _job(tmp_path, support_tape)
    folder, outcome = attribute(job, tape=support_tape, out=str(tmp_path))
    assert outcome.status in ("complete", "budget_exhausted")
    top = {r["intervention"]: r for r in outcome.attribution if r["rank"] == 1}
    # The decision step that read the injected note is the top resample cause (by blame)...
    assert top["resample"]["step"] == 4, outcome.attribution
    assert top["resample"]["phi_lo"] > 0
    # ...and the injected tool result is the top observation cause.
    assert top["observation"]["step"] == 1
    assert top["observation"]["flip_lo"] > 0.5
    rows = _rows(folder)
    ids = [r["task_id"] for r in rows]
    assert len(ids) == len(set(ids)) == outcome.progress.done
    info = read_job_json(tmp_path, outcome.job_id)
    assert info is not None and info["status"] == outcome.status
    assert info["ledger"]["spent"]["forks"] == len(rows)
    assert info["ledger"]["spent"]["forks"] <= 3000
    # The Shapley candidates (the steps the screen saw make choices) are in job.json and
    # are the ranked re-drawn steps: the decision and the policy check before it.
    ranked = [r for r in outcome.attribution if r["intervention"] == "resample" and r["rank"]]
    assert info["shapley_candidates"] == sorted(r["step"] for r in ranked) == [2, 4]
    # DuckDB reads the output as it is.
    forks = duckdb.sql(f"select count(*) from read_parquet('{folder}/forks/*.parquet')")
    assert forks.fetchall() == [(len(rows),)]
    ranked = duckdb.sql(
        f"select step from read_parquet('{folder}/attribution.parquet') "
        "where intervention = 'resample' and rank = 1"
    ).fetchall()
    assert ranked == [(4,)]
    assert (Path(folder) / "report.html").stat().st_size > 100_000


@pytest.mark.parametrize(("cap", "value"), [("max_forks", 30), ("max_usd", 0.002)])
def test_caps_hold(tmp_path: Path, support_tape: Tape, cap: str, value: float) -> None:
    job = _job(tmp_path, support_tape)
    folder, outcome = attribute(
        job,
        tape=support_tape,
        out=str(tmp_path),
        **{cap: value},  # type: ignore[arg-type]
    )
    rows = _rows(folder)
    info = read_job_json(tmp_path, outcome.job_id)
    assert info is not None
    spent = info["ledger"]["spent"]
    assert outcome.status == "budget_exhausted"
    if cap == "max_forks":
        assert len(rows) <= value and spent["forks"] <= value
    else:
        assert sum(r["cost_usd"] for r in rows) <= value
        assert spent["usd"] <= value
        # Reservations close to the truth: the job spends most of its cap before it stops
        # (reserving the worst case for every fork, it stopped at 14% of it), and a fork's
        # reservation is a few times what it cost (the worst case was ~23x).
        assert spent["usd"] >= value / 2, spent
        ratio = info["ledger"]["reservations"]["median_ratio"]
        assert ratio is not None and ratio <= 8, info["ledger"]["reservations"]
    # It still reports what it measured, with honest intervals.
    assert any(r["flip_n"] > 0 for r in outcome.attribution)


def test_a_worker_killed_mid_job_costs_time_only(tmp_path: Path, support_tape: Tape) -> None:
    # The uniform scheme with a live tail: 700 forks, each a few live calls, at 30 ms a call.
    job = _job(tmp_path, support_tape, method="uniform", uniform_tail="live", forks_per_step=100)
    job.spec.budget.max_forks = 700
    job.spec.provider.sim_latency_ms = 30.0
    job_id = job_id_of(job, support_tape)
    killed: list[int] = []
    finished = threading.Event()

    def killer() -> None:
        while not finished.is_set() and not killed:
            info = read_job_json(tmp_path, job_id) or {}
            if info.get("workers") and info.get("progress", {}).get("done", 0) >= 150:
                os.kill(info["workers"][0], signal.SIGKILL)
                killed.append(info["workers"][0])
            finished.wait(0.1)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        folder, outcome = attribute(job, tape=support_tape, out=str(tmp_path))
    finally:
        finished.set()
        thread.join()
    assert killed, "the worker was never killed (the job ended too soon?)"
    rows = _rows(folder)
    ids = [r["task_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a fork was written twice"
    assert outcome.progress.lost > 0, "the kill should have lost forks in flight"
    assert {r["status"] for r in rows} <= {"ok", "blocked_effect"}
    info = read_job_json(tmp_path, job_id)
    assert info is not None
    # The lost attempts are counted as spent: the cap holds with them.
    assert info["ledger"]["spent"]["forks"] <= 700
    assert info["ledger"]["spent"]["forks"] >= len(rows) + 1
    assert max(r["attempt"] for r in rows) >= 1


def test_a_killed_driver_resumes_without_losing_or_repeating_a_row(
    tmp_path: Path, demo_tape_path: Path
) -> None:
    job_file = support_job_file(
        tmp_path / "job", demo_tape_path, sim_latency_ms="150", max_forks="900"
    )
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "160"}
    command = attribute_command(job_file, out)
    first = start_attribute(job_file, out, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        parts: list[Path] = []
        while time.monotonic() < deadline:
            parts = list(out.glob("*/forks/part-*.parquet"))
            if len(parts) >= 2:
                break
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.1)
        assert len(parts) >= 2, "the first run never wrote two parts"
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        # The driver's own Ray and simulated provider die with its session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)
    folder = parts[0].parent.parent
    # Every row the sink took before the kill: in its parts, or journaled since the last.
    before = ForkSink.existing(out, folder.name).to_pylist()
    job_json = json.loads((folder / "job.json").read_text())
    spent_before = job_json["ledger"]["spent"]["forks"] if "ledger" in job_json else len(before)
    assert before, "rows were written before the kill"
    # Read back before the resume, the folder says it holds no finished run and what it has.
    partial = subprocess.run(
        [sys.executable, "-m", "car_ray.cli", "results", str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert partial.returncode == 1
    assert f"PARTIAL: {folder} holds no finished run" in partial.stdout
    assert f"{len(before)} fork rows are saved" in partial.stdout
    # Its spend is at least its rows' (the ledger job.json last wrote may lag them), it names
    # only the files there are, and it claims no verdict.
    said = " ".join(partial.stdout.split())
    ledger_usd = job_json["ledger"]["spent"]["usd"] if "ledger" in job_json else 0.0
    cost = max(sum(r["cost_usd"] for r in before), ledger_usd)
    assert f"saved results: spent {max(len(before), spent_before)} forks, ${cost:.4f}" in said
    assert f"results: {folder}/forks/*.parquet, job.json\n" in partial.stdout
    assert partial.stdout.rstrip().endswith(
        "verdict: none yet: the job has not finished (run it again on the same output)"
    )

    second = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert second.returncode == 0, second.stderr[-3000:]
    after = _rows(str(folder))
    ids = [r["task_id"] for r in after]
    assert len(ids) == len(set(ids)), "a fork was written twice"
    assert {r["task_id"] for r in before} <= set(ids), "a row written before the kill is gone"
    final = json.loads((folder / "job.json").read_text())
    assert final["resumed_rows"] == len(before)
    assert final["runs"] == 2
    # Spend continues from where it was, and the cap holds across both runs.
    assert final["ledger"]["spent"]["forks"] >= max(spent_before, len(before))
    assert final["ledger"]["spent"]["forks"] <= 900
    assert len(after) <= 900
