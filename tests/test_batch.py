"""`car-ray batch`: many failure traces under one budget in one shared pool, on the embedded
Ray and the simulated provider; output partitioned by trace and readable as one dataset; an
unattributable trace is reported, not fatal; a rerun continues; a SIGKILLed batch resumes
with no finished row lost or duplicated and its one budget carried on."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from itertools import combinations
from pathlib import Path
from urllib.parse import unquote

import pyarrow.parquet as pq
import pytest

from car_ray.attribute import tape_outcome
from car_ray.batch import batch_forks, batch_text, run_batch
from car_ray.job import Job
from car_ray.job import load_job as load
from car_ray.replay import BaseUrls, is_bad, record
from car_ray.results import BatchInfo, ForkSink, JobInfo, TraceRow
from car_ray.results._verdict import ROOT_KINDS, ROOT_SHARE
from car_ray.sim import SEPARATOR, SimServer
from car_ray.tape import load_tape
from car_ray.truth import solve

from .conftest import ROOT, run, stop_session, support_job_file

pytestmark = pytest.mark.usefixtures("ray_local")


def _record_runs(job: Job, sim: SimServer, folder: Path, failing: int, passing: int) -> list[Path]:
    """`failing` tapes of runs that went bad and `passing` of runs that did not, seeds 500.."""
    folder.mkdir(parents=True, exist_ok=True)
    bad: list[Path] = []
    good: list[Path] = []
    seed = 500
    while len(bad) < failing or len(good) < passing:
        path = folder / f"run{seed}.tape"
        tape, _ = run(
            record(
                job.load("agent"),
                job.spec.agent,
                job.spec.input,
                path,
                base_urls=BaseUrls.for_server(sim.url),
                seed=seed,
            )
        )
        wanted = bad if is_bad(tape_outcome(job, tape)) else good
        limit = failing if wanted is bad else passing
        if len(wanted) < limit:
            wanted.append(path)
        else:
            path.unlink()
        seed += 1
        assert seed < 600, "the demo policy should fail and pass within 100 seeds"
    return bad + good


def test_a_batch_attributes_each_trace_reports_the_bad_ones_and_continues(
    support_job: Job, support_sim: SimServer, tmp_path: Path
) -> None:
    tapes = tmp_path / "tapes"
    paths = _record_runs(support_job, support_sim, tapes, failing=3, passing=1)
    (tapes / "cut.tape").write_text('{"format": "car-ray-tape"')  # cut off mid-line
    job = load(support_job_file(tmp_path / "job", paths[0]))
    out = tmp_path / "out"
    given = [str(p) for p in [*paths, tapes / "cut.tape"]]
    result = run_batch(job, given, out=str(out), budget_usd=0.5, max_forks=600)

    by_status = Counter(r.status for r in result.rows)
    assert by_status == {"complete": 3, "not_failing": 1, "corrupt": 1}, result.rows
    assert result.info.status == "complete" and result.exit_code == 0
    cut = next(r for r in result.rows if r.status == "corrupt")
    assert "cut.tape" in (cut.reason or "")
    passing = next(r for r in result.rows if r.status == "not_failing")
    assert "nothing to explain" in (passing.reason or "")

    # Each trace's rank-1 step is its exact top cause (the solver on the same tape).
    for row in result.rows:
        if row.status != "complete":
            continue
        truth = run(solve(job, load_tape(Path(row.tape))))
        assert row.top_step in truth.top, (row, truth.top)
        # And its root is the input whose replacement clears the failure most, exactly.
        flips = {a.step: a.flip for a in truth.arms if a.kind in ROOT_KINDS}
        assert max(flips.values()) > ROOT_SHARE and row.root_step == max(flips, key=flips.get)
        assert (row.root_intervention, row.root_tool) == ("observation", "lookup_order")
        assert (out / result.info.batch_id / row.folder / "report.html").exists()

    # Partitioned by trace and readable as one dataset: its rows per trace are the forks
    # each trace's ledger counts, and the batch's spend is the traces' total, within caps.
    forks = batch_forks(result.folder).to_table(columns=["trace", "task_id", "cost_usd"])
    per_trace = Counter(forks.column("trace").to_pylist())
    done = [r for r in result.rows if r.status == "complete"]
    assert per_trace == {r.trace: r.forks for r in done}
    assert len(set(forks.column("task_id").to_pylist())) == forks.num_rows
    # One job file and one attribution seed, yet independent trials: no fork seed (and so
    # no fresh draw) is shared by two traces, or one unlucky draw sequence would hit them all.
    seeds: dict[str, set[int]] = {}
    for fork in batch_forks(result.folder).to_table(columns=["trace", "spec"]).to_pylist():
        seeds.setdefault(fork["trace"], set()).add(json.loads(fork["spec"])["seed"])
    assert len(seeds) == 3
    assert all(not a & b for a, b in combinations(seeds.values(), 2)), seeds
    assert result.info.spent.forks == sum(r.forks for r in done) <= 600
    assert result.info.spent.usd == pytest.approx(sum(r.usd for r in done), abs=1e-9)
    assert result.info.spent.usd <= 0.5
    traces = pq.read_table(Path(result.folder) / "traces.parquet").to_pylist()
    assert sorted(t["trace"] for t in traces) == sorted(r.trace for r in result.rows)
    summary = pq.read_table(Path(result.folder) / "summary.parquet").to_pylist()
    status = {s["key"]: s["traces"] for s in summary if s["dimension"] == "status"}
    assert status == {"complete": 3, "not_failing": 1, "corrupt": 1}
    # The terminal names the root the traces share and their rank-1 causes.
    said = batch_text(result).splitlines()
    assert said[1] == "roots: step 1 (lookup_order result) in 3 (of 3 attributed traces)"
    assert said[2].startswith("rank-1 causes: step ")

    # The same command again, twice: every trace ended, nothing runs, nothing is spent, and
    # each trace keeps what it ran under and showed (its cap in batch.json and its row).
    def kept(rows: list[TraceRow]) -> list[tuple[object, ...]]:
        return [(r.trace, r.status, r.top_step, r.cap_usd, r.cap_forks, r.verdict) for r in rows]

    caps = {name: state.cap for name, state in result.info.traces.items()}
    assert any(cap is not None for cap in caps.values())
    for runs in (2, 3):
        again = run_batch(job, given, out=str(out), budget_usd=0.5, max_forks=600)
        assert again.info.spent == result.info.spent and again.info.runs == runs
        assert kept(again.rows) == kept(result.rows)
        on_disk = BatchInfo.read(str(out), result.info.batch_id)
        assert on_disk is not None
        assert {name: state.cap for name, state in on_disk.traces.items()} == caps


def test_an_equal_split_caps_each_trace_at_its_share(
    support_job: Job, support_sim: SimServer, tmp_path: Path
) -> None:
    paths = _record_runs(support_job, support_sim, tmp_path / "tapes", failing=3, passing=0)
    job = load(support_job_file(tmp_path / "job", paths[0]))
    result = run_batch(
        job, [str(p) for p in paths], out=str(tmp_path / "out"), max_forks=60, split="equal"
    )
    for row in result.rows:
        assert row.cap_forks == 20 and 0 < row.forks <= 20, row
    assert result.info.spent.forks <= 60


def _rows_on_disk(folder: Path) -> dict[str, list[str]]:
    """Every trace's (or cell's) fork task ids on disk (parts and journal)."""
    found = {}
    for trace in sorted(folder.glob("*=*")):
        found[trace.name] = ForkSink.existing(folder, trace.name).column("task_id").to_pylist()
    return found


@pytest.mark.parametrize("kind", ["batch", "sweep"])
def test_a_sigkilled_batch_or_sweep_resumes_without_losing_or_repeating_a_row(
    kind: str, support_job: Job, support_sim: SimServer, tmp_path: Path
) -> None:
    paths = _record_runs(support_job, support_sim, tmp_path / "tapes", failing=4, passing=0)
    # Slow forks (80 ms a model call), so the kill lands with jobs ended and running.
    job_file = support_job_file(tmp_path / "job", paths[0], sim_latency_ms="80")
    out = tmp_path / "out"
    if kind == "batch":
        args = [
            "batch", "--job", str(job_file), "--from", str(tmp_path / "tapes"),
            "--max-forks", "2000", "--budget-usd", "1",
        ]  # fmt: skip
    else:  # four cells: two settings over two of the tapes
        sweep = tmp_path / "grid.toml"
        sweep.write_text(
            f'job = "{job_file}"\ntapes = ["{paths[0]}", "{paths[1]}"]\n'
            "max_forks = 2000\nmax_usd = 1.0\n[grid]\nconfidence = [0.9, 0.95]\n"
        )
        args = ["sweep", str(sweep)]
    command = [sys.executable, "-m", "car_ray.cli", *args, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "jobs"), "COLUMNS": "200"}
    first = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        folder: Path | None = None
        while time.monotonic() < deadline:
            found = list(out.glob(f"*-{kind}-*"))
            if found:
                folder = found[0]
                ended = [
                    j
                    for j in folder.glob("*=*/job.json")
                    if json.loads(j.read_text()).get("status") == "complete"
                ]
                rows = _rows_on_disk(folder)
                if ended and sum(1 for ids in rows.values() if ids) > len(ended):
                    break
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.2)
        else:
            pytest.fail(f"the {kind} never had a job ended and another with rows")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        stop_session(first, timeout_s=10)
    assert folder is not None
    before = _rows_on_disk(folder)
    spent_before = BatchInfo.model_validate_json((folder / "batch.json").read_text()).spent

    # The same command; the provider answers at once now (a provider setting is not part of
    # a job's or a batch's identity: the jobs resume).
    support_job_file(tmp_path / "job", paths[0], sim_latency_ms="0")
    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    after = _rows_on_disk(folder)
    assert len(after) == 4
    for job_id, ids in before.items():
        assert set(ids) <= set(after[job_id]), f"{job_id} lost rows it had before the kill"
    for job_id, ids in after.items():
        assert len(ids) == len(set(ids)), f"{job_id} has a fork twice"
        info = JobInfo.read(folder, job_id)
        assert info is not None and info.status == "complete"
    info = BatchInfo.model_validate_json((folder / "batch.json").read_text())
    assert info.runs == 2 and info.status == "complete"
    # One budget across both runs: it counts what the killed run spent.
    assert info.spent.forks >= sum(len(ids) for ids in after.values())
    assert info.spent.forks >= spent_before.forks and info.spent.usd <= 1.0


def test_a_sweep_stopped_by_its_cap_says_which_cells_did_not_complete_and_continues(
    tmp_path: Path,
) -> None:
    from car_ray.sweep import run_sweep

    nightly = ROOT / "jobs" / "nightly" / "job.toml"
    sweep = tmp_path / "grid.toml"

    def write(max_forks: int) -> None:
        sweep.write_text(
            f'job = "{nightly}"\nmax_forks = {max_forks}\n'
            '[grid]\nconfidence = [0.9, 0.95]\n"budget.max_forks" = [60]\n'
        )

    write(16)  # 8 forks a cell: not enough for an answer
    first = run_sweep(sweep, out=str(tmp_path / "out"))
    assert first.info.kind == "sweep" and len(first.rows) == 2
    assert {r.status for r in first.rows} <= {"budget_exhausted", "nothing_measured"}, first.rows
    assert first.info.spent.forks <= 16
    before = _rows_on_disk(Path(first.folder))

    write(400)  # the same grid under a larger cap: the same sweep, continued
    second = run_sweep(sweep, out=str(tmp_path / "out"))
    assert second.folder == first.folder and second.info.runs == 2
    assert [r.status for r in second.rows] == ["complete", "complete"], second.rows
    # Each cell's planted cause (the nightly tape: the injected note in step 1's order).
    assert all(r.top_step == 1 and r.top_intervention == "observation" for r in second.rows)
    after = _rows_on_disk(Path(second.folder))
    for cell, ids in before.items():
        assert set(ids) <= set(after[cell]) and len(after[cell]) == len(set(after[cell]))
    assert second.info.spent.forks == sum(len(ids) for ids in after.values()) <= 400
    assert {json.loads(r.settings or "{}")["confidence"] for r in second.rows} == {0.9, 0.95}


@pytest.mark.parametrize("name", ["nightly", "nightly_noisy"])
def test_a_nightly_batch_names_the_planted_causes_and_goes_past_bad_traces(
    tmp_path: Path, name: str
) -> None:
    """jobs/nightly's generated traces, and the same runs recorded from jobs/nightly_noisy's
    model, whose every step is worded a thousand ways (its job holds decisions)."""
    traces = tmp_path / "traces"
    job_file = ROOT / "jobs" / name / "job.toml"
    subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "nightly" / "generate.py"), str(traces),
         "--count", "12", "--corrupt", "1", "--seed", "3", "--job", str(job_file)],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "jobs")},
    )  # fmt: skip
    from car_ray.batch import find_tapes, read_manifest_for

    job = load(job_file)
    other = ROOT / "jobs" / "support_refund" / "support_refund.tape"
    given = find_tapes(str(traces), [str(other)] if other.exists() else [])
    manifest = read_manifest_for(None, str(traces))
    if name == "nightly_noisy":
        # Every model step of every run is worded: a sentence beside its tool calls, an aside
        # after its answer.
        for tape_name, entry in manifest.items():
            if entry["planted"] != "corrupt":
                steps = load_tape(traces / tape_name).steps
                texts = [(e.action or {}).get("text") or "" for e in steps if e.type == "llm"]
                assert all(texts) and SEPARATOR in texts[-1], tape_name
    result = run_batch(job, given, out=str(tmp_path / "out"), budget_usd=1.0, manifest=manifest)
    assert result.exit_code == 0 and result.info.spent.usd <= 1.0
    planted = Counter(
        (e["step"], e["planted"]) for e in manifest.values() if e["planted"] != "corrupt"
    )
    named = Counter((r.top_step, r.planted) for r in result.rows if r.status == "complete")
    assert named == planted  # every trace's rank-1 step is the one planted in it
    summary = pq.read_table(Path(result.folder) / "summary.parquet").to_pylist()
    steps = {s["key"]: s["traces"] for s in summary if s["dimension"] == "step"}
    by_step = Counter(step for step, _ in planted.elements())
    assert sorted(steps.values()) == sorted(by_step.values()) and sum(steps.values()) == 12
    assert [r.status for r in result.rows].count("corrupt") == 1
    # The batch page links each attributed trace's own report, and nothing that is not there.
    page = (Path(result.folder) / "report.html").read_text()
    links = re.findall(r'<a href="([^"]+)"', page)
    assert len(links) == 12 and all((Path(result.folder) / unquote(h)).is_file() for h in links)


def test_a_batch_of_several_agents_attributes_each_trace_with_its_agents_job_file(
    support_job: Job, support_sim: SimServer, tmp_path: Path
) -> None:
    nightly_tapes = tmp_path / "nightly"
    subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "nightly" / "generate.py"), str(nightly_tapes),
         "--count", "4", "--seed", "5"],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT / "jobs")},
    )  # fmt: skip
    from car_ray.batch import find_tapes, read_manifest_for

    support_tapes = _record_runs(support_job, support_sim, tmp_path / "support", 2, 0)
    support = load(support_job_file(tmp_path / "job", support_tapes[0]))
    nightly = load(ROOT / "jobs" / "nightly" / "job.toml")
    given = find_tapes(str(nightly_tapes), [str(p) for p in support_tapes])
    manifest = read_manifest_for(None, str(nightly_tapes))
    out = str(tmp_path / "out")
    result = run_batch([nightly, support], given, out=out, budget_usd=1.0, manifest=manifest)

    assert result.exit_code == 0 and result.info.spent.usd <= 1.0
    assert result.info.job_files == [str(nightly.path), str(support.path)]
    assert [r.status for r in result.rows] == ["complete"] * 6, result.rows
    for row in result.rows[:4]:  # the nightly agent's traces: each its planted step
        assert row.planted_step is not None and row.top_step == row.planted_step, row
    for row in result.rows[4:]:  # the support agent's: each its exact top cause
        truth = run(solve(support, load_tape(Path(row.tape))))
        assert row.top_step in truth.top, (row, truth.top)
    per_trace = Counter(batch_forks(result.folder).to_table(["trace"]).column(0).to_pylist())
    assert per_trace == {r.trace: r.forks for r in result.rows}

    # Without the support job file its tapes are another agent's: reported, nothing run.
    alone = run_batch(nightly, [str(support_tapes[0])], out=out, budget_usd=1.0)
    (row,) = alone.rows
    assert row.status == "other_agent" and "add its job file with another --job" in (
        row.reason or ""
    )
    assert alone.info.spent.forks == 0
    # Two job files of one agent: which would a tape go to? Refused, naming both.
    copy = load(support_job_file(tmp_path / "copy", support_tapes[0]))
    with pytest.raises(ValueError, match=f"--job {copy.path} and --job {support.path} both"):
        run_batch([support, copy], given, out=out, budget_usd=1.0)
