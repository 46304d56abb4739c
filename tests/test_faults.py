"""Faults that must never change the answer: a provider failure is not an outcome (its own
status, never scored, run again), an agent that raises is `agent_error`, a failed control or a
mostly-failed job is a failed job (non-zero exit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest

from car_ray.attribute import attribute
from car_ray.job import Job, load_job
from car_ray.replay import (
    AiohttpUpstream,
    BaseUrls,
    ForceAction,
    ForkRunner,
    ForkSpec,
    Resample,
    RetryPolicy,
)
from car_ray.replay._interventions import ForcedToolCall
from car_ray.results import JobInfo
from car_ray.sim import SimServer
from car_ray.tape import Tape

from .conftest import ROOT, SUPPORT_JOB, run

FAST_RETRY = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)


def _fork(job: Job, tape: Tape, url: str, spec: ForkSpec) -> Any:
    async def go() -> Any:
        runner = ForkRunner(
            job.load("agent"),
            job.load("scorer"),
            base_urls=BaseUrls.for_server(url),
            upstream=AiohttpUpstream(retry=FAST_RETRY),
        )
        runner.add_tape(tape)
        try:
            return await runner.run(spec)
        finally:
            await runner.aclose()

    return run(go())


def test_a_provider_outage_is_a_provider_error_never_an_outcome(
    support_job: Job, support_tape: Tape
) -> None:
    # Every answer a 429: the fork's live call fails after its retries. Before, the agent
    # crashed, the scorer read "no refund" and the row counted as a flip.
    spec = ForkSpec(tape_id=support_tape.tape_id, interventions={4: Resample()}, seed=3)
    with SimServer(support_job.load("policy"), rate_429=1.0, retry_after_s=0.01) as sim:
        row = _fork(support_job, support_tape, sim.url, spec)
    assert row.status == "provider_error"
    assert row.provider_status == 429
    assert row.outcome is None and row.flipped is None
    assert "429" in (row.error or "")
    assert row.retries >= 1


def test_a_broken_connection_is_a_provider_error_with_no_status(
    support_job: Job, support_tape: Tape
) -> None:
    spec = ForkSpec(tape_id=support_tape.tape_id, interventions={4: Resample()}, seed=3)
    # Port 9 (discard) on the loopback: nobody listens, the connection is refused.
    row = _fork(support_job, support_tape, "http://127.0.0.1:9", spec)
    assert row.status == "provider_error"
    assert row.provider_status is None
    assert row.outcome is None and row.flipped is None


def test_an_agent_that_raises_is_an_agent_error_with_its_exception(
    support_job: Job, support_sim: SimServer, support_tape: Tape
) -> None:
    # A forced call to a tool the agent has no function for: its dispatch raises KeyError.
    force = ForceAction(tool_calls=[ForcedToolCall(name="no_such_tool", arguments={})])
    spec = ForkSpec(tape_id=support_tape.tape_id, interventions={0: force}, tail="live")
    row = _fork(support_job, support_tape, support_sim.url, spec)
    assert row.status == "agent_error", row
    assert row.error is not None and row.error.startswith("KeyError: ")
    assert "no_such_tool" in row.error
    # The agent's own crash is its outcome under the intervention: scored.
    assert row.outcome is not None and row.flipped is not None


def _rows(folder: str) -> list[dict[str, Any]]:
    return pads.dataset(os.path.join(folder, "forks"), format="parquet").to_table().to_pylist()


@pytest.mark.usefixtures("ray_local")
def test_at_30pct_429_and_10pct_5xx_the_answer_is_the_clean_one(
    tmp_path: Path, support_tape: Tape
) -> None:
    """The demo job twice with the same attribution seed: on a clean simulated provider and
    on one answering 30% 429 and 10% 5xx, each call tried twice (a call fails for good 16%
    of the time). No provider failure is scored, task ids are unique, the caps hold, and the
    faulty run's top cause and phi lie in the clean run's intervals."""
    base = load_job(SUPPORT_JOB)
    clean_spec = base.spec.model_copy(update={"attribution_seed": 5})
    faulty_provider = base.spec.provider.model_copy(
        update={"sim_rate_429": 0.3, "sim_rate_5xx": 0.1, "max_attempts": 2}
    )
    faulty_spec = clean_spec.model_copy(update={"provider": faulty_provider})
    _, clean = attribute(Job(base.path, clean_spec), tape=support_tape, out=str(tmp_path / "c"))
    folder, faulty = attribute(
        Job(base.path, faulty_spec), tape=support_tape, out=str(tmp_path / "f")
    )
    assert clean.status in ("complete", "budget_exhausted")
    assert faulty.status in ("complete", "budget_exhausted"), faulty.notes

    rows = _rows(folder)
    ids = [r["task_id"] for r in rows]
    assert len(ids) == len(set(ids))
    failed = [r for r in rows if r["status"] == "provider_error"]
    assert failed, "at 40% faults and two tries a call, some forks must fail at the provider"
    assert all(r["outcome"] is None and r["flipped"] is None for r in failed)
    assert {r["provider_status"] for r in failed} <= {429, 500, 503, None}
    assert all(r["provider_status"] is None for r in rows if r["status"] != "provider_error")
    info = JobInfo.read(str(tmp_path / "f"), faulty.job_id)
    assert info is not None and info.ledger is not None and info.ledger.caps is not None
    assert info.provider_errors == len(failed) == faulty.progress.provider_errors
    assert info.fork_statuses["provider_error"] == len(failed)
    # Caps: the default auto cap of 10 forks a step, every provider failure counted in it.
    caps = info.ledger.caps
    assert caps.max_forks is not None
    assert info.ledger.spent.forks == len(rows) <= caps.max_forks

    def by_step(outcome: Any) -> dict[int, dict[str, Any]]:
        return {
            r["step"]: r
            for r in outcome.attribution
            if r["intervention"] == "resample" and r["phi"] is not None
        }

    want, got = by_step(clean), by_step(faulty)
    top = [s for s, r in want.items() if r["rank"] == 1]
    assert [s for s, r in got.items() if r["rank"] == 1] == top == [4]
    for step, r in want.items():
        assert r["phi_lo"] - 1e-9 <= got[step]["phi"] <= r["phi_hi"] + 1e-9, (step, r, got[step])


@pytest.mark.usefixtures("ray_local")
def test_a_provider_down_for_good_is_a_failed_job_not_a_crash(
    tmp_path: Path, support_tape: Tape
) -> None:
    """Every answer a 429 and one try a call: each fork that calls the provider is tried four
    times under four distinct ledger keys, then given up; once three forks are given up
    with no live call answered, the job stops (the rest would fail the same), says why and
    what to do, and says it failed."""
    base = load_job(SUPPORT_JOB)
    provider = base.spec.provider.model_copy(update={"sim_rate_429": 1.0, "max_attempts": 1})
    job = Job(base.path, base.spec.model_copy(update={"provider": provider}))
    folder, outcome = attribute(job, tape=support_tape, out=str(tmp_path))
    rows = _rows(folder)
    # The control makes no live call (the tape answers it), so it passes; then every fork
    # that calls the provider fails at it, is tried four times and given up: a failed job.
    assert outcome.status == "failed", outcome.notes
    assert rows and all(r["status"] in ("ok", "provider_error") for r in rows)
    failed = [r for r in rows if r["status"] == "provider_error"]
    assert failed and all(r["task_id"].rsplit("/p", 1)[1] in "0123" for r in failed)
    assert any("gave up a fork after 4 provider failures" in n.text for n in outcome.notes)
    assert any(n.kind == "failed" and n.text.startswith("FAILED:") for n in outcome.notes)
    (down,) = [n for n in outcome.notes if n.kind == "provider_down"]
    assert "answered none of this run's live calls" in down.text and "it resumes" in down.text
    # Stopped at the third fork given up: only forks already in flight (at most a window of
    # them) were given up after it, of the 70 the budget allowed.
    gave_up = sum(n.kind == "gave_up" for n in outcome.notes)
    assert 3 <= gave_up <= 3 + 8, gave_up


FLAKY_AGENT = '''
"""The null-control agent with a process-wide leftover: from its second run in a process on,
it warms a cache first (a tool call the tape does not have). The first run of each process
(the recording, then a worker's replay) is clean; every fork after it is not."""

import itertools

from null_control.agent import fulfilment_agent, late_delivery  # noqa: F401

_RUNS = itertools.count()


async def flaky_agent(ctx):
    if next(_RUNS) >= 1:
        ctx.tool("warm_cache", lambda: {"warm": True})
    return await fulfilment_agent(ctx)
'''


def _attribute_alone(job_file: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`car-ray attribute` in its own process, as a user runs it, its output under tmp_path."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'jobs'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "NO_COLOR": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    return subprocess.run(
        [
            *(sys.executable, "-m", "car_ray.cli", "attribute", str(job_file)),
            *("--out", str(tmp_path / "out")),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )


def test_a_failed_control_is_a_failed_job_with_a_non_zero_exit(tmp_path: Path) -> None:
    folder = tmp_path / "flaky"
    folder.mkdir()
    (folder / "flaky_null.py").write_text(FLAKY_AGENT)
    job = (ROOT / "jobs" / "null_control" / "job.toml").read_text()
    job = job.replace('"null_control.agent:fulfilment_agent"', '"flaky_null:flaky_agent"')
    job = job.replace('"null_control.agent:late_delivery"', '"flaky_null:late_delivery"')
    job = job.replace('tape = "null_control.tape"', 'tape = "flaky.tape"')
    # One worker: the replay check and the control run in the same process, in that order.
    job += "\n[provider]\nworkers = 1\n"
    (folder / "job.toml").write_text(job)
    done = _attribute_alone(folder / "job.toml", tmp_path)
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed
    assert "NEGATIVE CONTROL FAILED" in printed
    assert "car-ray fork" in printed  # how to check
    (job_dir,) = (tmp_path / "out").iterdir()
    info = json.loads((job_dir / "job.json").read_text())
    assert info["status"] == "control_failed"
    # It stopped at the control: nothing was spent measuring the nondeterminism.
    assert info["ledger"]["spent"]["forks"] == 1


# A scorer that reads what only the job's own process has (here, whether it is a Ray worker;
# in life, a file or an environment variable on the driver's machine).
DRIVER_ONLY_SCORER = """
import ray

from null_control.agent import late_delivery


def late_on_the_driver(result, trajectory):
    worker = ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    return 0.0 if worker else 1.0
"""


def test_a_scorer_the_workers_read_otherwise_stops_the_job_before_any_fork(
    tmp_path: Path,
) -> None:
    """The tape scored bad where the job runs and not bad in the workers: every fork would be
    scored against the workers' reading, none would flip, and the job would say "no step to
    blame" with exit 0. It stops at the check instead, saying what the scorer must not do."""
    folder = tmp_path / "driver_only"
    folder.mkdir()
    (folder / "driver_only.py").write_text(DRIVER_ONLY_SCORER)
    job = (ROOT / "jobs" / "null_control" / "job.toml").read_text()
    job = job.replace('"null_control.agent:late_delivery"', '"driver_only:late_on_the_driver"')
    job = job.replace(
        'tape = "null_control.tape"',
        f'tape = "{ROOT / "jobs" / "null_control" / "null_control.tape"}"',
    )
    (folder / "job.toml").write_text(job)
    done = _attribute_alone(folder / "job.toml", tmp_path)
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed
    assert "the workers score the replayed tape 0.0, where this process scored it 1.0" in printed
    assert "no step to blame" not in printed
    (job_dir,) = (tmp_path / "out").iterdir()
    info = json.loads((job_dir / "job.json").read_text())
    assert info["status"] == "verify_failed" and info["ledger"]["spent"]["forks"] == 0


def test_errors_cross_a_process_boundary_whole() -> None:
    # A fork's error travels from a Ray worker or a pool process to the driver by pickle; an
    # exception whose __init__ takes more than its message came back as a TypeError instead.
    import pickle

    from car_ray.execute._protocol import BatchLost
    from car_ray.replay._divergence import DivergenceError
    from car_ray.replay._run import ProviderFailed, ToolFailed
    from car_ray.tape import TapeError

    for error in (
        TapeError(Path("night/run-7.tape"), 12, "line 12 fails its hash"),
        DivergenceError(3, "the request changed"),
        ProviderFailed(4, 503, "service unavailable after 4 tries"),
        ToolFailed("LookupError", "no order 42"),
        BatchLost([], RuntimeError("worker died")),
    ):
        error.add_note("while attributing night/run-7.tape")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error)
        assert str(back) == str(error)
        assert vars(back).keys() == vars(error).keys()
        assert back.__notes__ == ["while attributing night/run-7.tape"]


def _ensure(job_file: str, tape: str) -> str:
    from car_ray._scenario import ensure_tape

    job = load_job(job_file)
    job = Job(job.path, job.spec.model_copy(update={"tape": tape}))
    return ensure_tape(job).tape_id


def test_processes_that_record_one_scenario_at_once_share_one_whole_tape(tmp_path: Path) -> None:
    # Before, the second process found the first one's tape half written and failed on it.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    tape = str(tmp_path / "relay.tape")
    job_file = str(ROOT / "jobs" / "relay" / "job.toml")
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        ids = list(pool.map(_ensure, [job_file] * 3, [tape] * 3))
    assert len(set(ids)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["relay.tape"]  # no partial left behind


def test_a_scenario_tape_is_recorded_where_the_filesystem_has_no_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FAT and some network mounts refuse os.link: the whole recording is renamed into place.
    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    tape = str(tmp_path / "relay.tape")
    tape_id = _ensure(str(ROOT / "jobs" / "relay" / "job.toml"), tape)
    assert [p.name for p in tmp_path.iterdir()] == ["relay.tape"]
    assert _ensure(str(ROOT / "jobs" / "relay" / "job.toml"), tape) == tape_id
