"""Recording in production (`car_ray.recording`): real agents, the real openai and anthropic
SDKs, the simulated provider over real HTTP on 127.0.0.1; each run's tape replays with
car-ray's own replay, failing runs are listed for batch, keys never reach a tape."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import car_ray
from car_ray.attribute import tape_outcome
from car_ray.cli import app
from car_ray.job import Job, load_job
from car_ray.recorder import RecordedRun, Recording, marked_tapes, read_mark
from car_ray.replay import BaseUrls, ForkRunner, RunResult
from car_ray.sim import SimServer
from car_ray.tape import Tape, load_tape

from .conftest import RESEARCH_JOB, ROOT, SUPPORT_JOB

SECRET = "sk-test-RECORDING-5c1d2e"
# jobs/support_refund's agent with seed 3 is talked into the refund (the demo's failure);
# with seed 5 it refuses. The marks are checked against the job's scorer on the tape, not
# against these words.
BAD_SEED, GOOD_SEED = 3, 5


class SeenKeys:
    """ASGI middleware in front of the simulated provider: the credentials it received, so a
    test knows the key was really sent (and then that the tape does not have it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.received: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name in (b"authorization", b"x-api-key"):
                    self.received.append(value.decode())
        await self.app(scope, receive, send)


def _sim(job: Job) -> Iterator[tuple[SimServer, SeenKeys]]:
    sim = SimServer(job.load("policy"))
    seen = SeenKeys(sim.app)
    sim.app = seen  # type: ignore[assignment]
    with sim:
        yield sim, seen


@pytest.fixture(scope="module")
def support() -> Iterator[tuple[SimServer, SeenKeys]]:
    yield from _sim(load_job(SUPPORT_JOB))


@pytest.fixture(scope="module")
def research_job() -> Job:
    return load_job(RESEARCH_JOB)


@pytest.fixture(scope="module")
def research(research_job: Job) -> Iterator[tuple[SimServer, SeenKeys]]:
    yield from _sim(research_job)


def _ticket(ticket_id: str) -> dict[str, str]:
    """The demo job's ticket under another id."""
    return {**load_job(SUPPORT_JOB).spec.input, "ticket_id": ticket_id}


def _replays(job: Job, tape: Path) -> float:
    """`car-ray replay TAPE --job JOB` as a user runs it (no network): the tape must replay
    faithfully; returns the recorded outcome by the job's scorer."""
    done = CliRunner().invoke(app, ["replay", str(tape), "--job", str(job.path)])
    assert done.exit_code == 0, done.output
    assert "faithful" in done.output
    found = re.search(r"recorded outcome ([0-9.]+)", done.output)
    assert found is not None, done.output
    return float(found.group(1))


def _replay_with(agent: Any, scorer: Any, tape: Tape) -> RunResult:
    """car-ray's replay of `tape` with this agent function (a divergence raises)."""
    runner = ForkRunner(agent, scorer, base_urls=BaseUrls.recorded_in(tape))
    runner.add_tape(tape)

    async def go() -> RunResult:
        try:
            return await runner.replay(tape.tape_id)
        finally:
            await runner.aclose()

    return asyncio.run(go())


def _recording(folder: Path, job: Job, sim: SimServer, **settings: Any) -> Recording:
    """Runs of the job's agent recorded against `sim`, marked by the job's scorer."""
    return car_ray.recording(
        folder, scorer=job.load("scorer"), base_urls=BaseUrls.for_server(sim.url), **settings
    )


def test_decorated_sync_agent_records_each_run_replayable_and_marked(
    support_job: Job, support: tuple[SimServer, SeenKeys], tmp_path: Path
) -> None:
    sim, seen = support
    folder = tmp_path / "traces"
    agent = _recording(folder, support_job, sim, api_keys={"openai": SECRET})(
        support_job.load("agent")
    )

    bad = agent.record(_ticket("T-1"), seed=BAD_SEED)
    good = agent.record(_ticket("T-2"), seed=GOOD_SEED)
    # A plain call returns what the agent returns, and records too.
    answer = agent(_ticket("T-3"))
    assert isinstance(answer, dict) and "reply" in answer

    tapes = sorted(folder.glob("*.tape"))
    assert len(tapes) == 3 and len({t.name for t in tapes}) == 3
    assert bad.path in tapes and good.path in tapes
    for run in (bad, good):
        tape = load_tape(run.path)
        assert tape.seal is not None and tape.tape_id == run.tape_id
        assert tape.header.agent == support_job.spec.agent  # the job's own reference
        assert tape.header.input == _ticket("T-1" if run is bad else "T-2")
        assert tape.seal.result == run.result
        # Faithful under car-ray's replay, with the job's agent and with the decorated one
        # (given car-ray's context it runs plain); the mark agrees with the job's scorer.
        outcome = _replays(support_job, run.path)
        replayed = _replay_with(agent, support_job.load("scorer"), tape)
        assert replayed.error is None and replayed.result == run.result
        assert outcome == tape_outcome(support_job, tape)
        assert run.mark is not None and run.mark.score == outcome
        assert run.mark.status == ("failed" if outcome >= 0.5 else "passed")
        assert run.mark.marked_by == "scorer"
    assert bad.mark is not None and bad.mark.status == "failed"
    assert good.mark is not None and good.mark.status == "passed"

    # Batch picks the failing runs only (the third run is listed iff its scorer said bad).
    third = next(t for t in tapes if t not in (bad.path, good.path))
    third_bad = tape_outcome(support_job, load_tape(third)) >= 0.5
    assert car_ray.failing_tapes(folder) == sorted([bad.path] + ([third] if third_bad else []))

    # The caller's word replaces the scorer's, after the run ended; it is in the mark file.
    good.mark_failed("the customer complained")
    assert good.path in car_ray.failing_tapes(folder)
    on_disk = json.loads((folder / good.path.name.replace(".tape", ".mark.json")).read_text())
    assert on_disk["status"] == "failed" and on_disk["marked_by"] == "caller"
    assert on_disk["reason"] == "the customer complained" and on_disk["score"] == 0.0
    car_ray.mark_tape(bad.path, failed=False, reason="refund was approved by a manager")
    assert bad.path not in car_ray.failing_tapes(folder)

    # The key reached the provider, and no tape or mark holds it or any auth header.
    assert any(SECRET in value for value in seen.received)
    for path in folder.iterdir():
        raw = path.read_bytes().lower()
        assert SECRET.lower().encode() not in raw, path
        for header in (b"authorization", b"x-api-key", b"bearer"):
            assert header not in raw, (path, header)


def _boom(ctx: car_ray.AgentContext) -> None:
    """An agent whose backend fails after its first model call."""
    client = ctx.openai()
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": str(ctx.input)}]
    )
    raise RuntimeError("order service unavailable")


def test_a_raising_agent_leaves_a_sealed_tape_marked_failed(
    support_job: Job, support: tuple[SimServer, SeenKeys], tmp_path: Path
) -> None:
    sim, _ = support
    boom = car_ray.recording(tmp_path, base_urls=BaseUrls.for_server(sim.url))(_boom)
    with pytest.raises(RuntimeError, match="order service unavailable") as raised:
        boom({"order": "A1001"})
    (tape_path,) = tmp_path.glob("*.tape")
    assert any(str(tape_path) in note for note in raised.value.__notes__)
    tape = load_tape(tape_path)
    assert tape.seal is not None and tape.seal.error is not None
    assert (tape.seal.error.type, tape.seal.error.message) == (
        "RuntimeError",
        "order service unavailable",
    )
    assert len(tape.steps) == 1
    mark = read_mark(tape_path)
    assert mark is not None and mark.status == "failed" and mark.marked_by == "error"
    assert mark.reason == "the agent raised RuntimeError: order service unavailable"
    assert car_ray.failing_tapes(tmp_path) == [tape_path]
    # The tape replays to the same end: the recorded error, raised again.
    replayed = _replay_with(_boom, support_job.load("scorer"), tape)
    assert isinstance(replayed.error, RuntimeError)


def test_context_manager_records_a_run_and_its_error(
    support_job: Job, support: tuple[SimServer, SeenKeys], tmp_path: Path
) -> None:
    sim, _ = support
    plain = support_job.load("agent")

    def recording(ticket: str, seed: int | None = None) -> Recording:
        return _recording(tmp_path, support_job, sim, agent=plain, input=_ticket(ticket), seed=seed)

    with recording("T-9", BAD_SEED) as run:
        run.result = plain(run.ctx)
    assert run.mark is not None and run.mark.status == "failed" and run.mark.score == 1.0
    tape = load_tape(run.path)
    assert tape.seal is not None and tape.seal.result == run.result
    assert _replays(support_job, run.path) == 1.0

    # The caller marks a run inside the block; an error in the block seals the tape with it.
    with recording("T-10", GOOD_SEED) as ok:
        ok.result = plain(ok.ctx)
        ok.mark_failed("reply was rude")
    assert ok.mark is not None and (ok.mark.status, ok.mark.reason) == ("failed", "reply was rude")
    assert ok.mark.score == 0.0  # the scorer still ran: its value is kept beside the mark

    with (
        pytest.raises(KeyError),
        recording("T-11") as broken,
    ):
        plain(broken.ctx)
        raise KeyError("crm")
    sealed = load_tape(broken.path).seal
    assert sealed is not None and sealed.error is not None and sealed.error.type == "KeyError"
    assert set(car_ray.failing_tapes(tmp_path)) == {run.path, ok.path, broken.path}

    with pytest.raises(TypeError, match="name the agent"), car_ray.recording(tmp_path):
        pass


def test_concurrent_threads_each_get_their_own_tape(
    support_job: Job, support: tuple[SimServer, SeenKeys], tmp_path: Path
) -> None:
    sim, _ = support
    agent = _recording(tmp_path, support_job, sim)(support_job.load("agent"))

    def one(i: int) -> RecordedRun:
        run: RecordedRun = agent.record(_ticket(f"T-{i}"), seed=i)
        return run

    with ThreadPoolExecutor(max_workers=6) as pool:
        runs = list(pool.map(one, range(12)))
    assert len({r.path for r in runs}) == 12 == len(list(tmp_path.glob("*.tape")))
    for i, run in enumerate(runs):
        tape = load_tape(run.path)
        # No cross-talk: each tape has its own input and result, and replays on its own.
        assert tape.header.input == _ticket(f"T-{i}") and tape.header.seed == i
        assert tape.seal is not None and tape.seal.result == run.result
        assert _replays(support_job, run.path) == (run.mark.score if run.mark else None)
    failing = {r.path for r in runs if r.mark is not None and r.mark.status == "failed"}
    assert set(car_ray.failing_tapes(tmp_path)) == failing
    assert 0 < len(failing) < 12  # both kinds among 12 seeds (fixed seeds: not by chance)


QUESTIONS = [f"How deep is Lake Veyra at its deepest point? ({i}) Cite sources." for i in range(6)]


def test_concurrent_asyncio_tasks_and_async_with(
    research_job: Job, research: tuple[SimServer, SeenKeys], tmp_path: Path
) -> None:
    sim, seen = research
    plain = research_job.load("agent")
    agent = _recording(tmp_path, research_job, sim, api_keys={"anthropic": SECRET})(plain)

    async def main() -> tuple[list[RecordedRun], RecordedRun]:
        runs = await asyncio.gather(
            *(agent.record({"question": q}, seed=i) for i, q in enumerate(QUESTIONS))
        )
        async with _recording(
            tmp_path, research_job, sim, agent=plain, input={"question": QUESTIONS[0]}, seed=0
        ) as run:
            run.result = await plain(run.ctx)
        return runs, run

    runs, in_block = asyncio.run(main())
    assert len({r.path for r in [*runs, in_block]}) == 7
    for run, question in [*zip(runs, QUESTIONS, strict=True), (in_block, QUESTIONS[0])]:
        tape = load_tape(run.path)
        assert tape.header.input == {"question": question}
        assert tape.seal is not None and tape.seal.result == run.result
        assert run.result["question"] == question
        assert len(tape.steps) == 8
        assert _replays(research_job, run.path) == (run.mark.score if run.mark else None)
    # The same seed and input in the block and in task 0: the same run, recorded twice.
    assert in_block.result["answer"] == runs[0].result["answer"]
    assert any(SECRET in value for value in seen.received)
    assert not any(SECRET.encode() in p.read_bytes() for p in tmp_path.iterdir())


def test_a_cancelled_run_is_sealed_and_marked_aborted(research_job: Job, tmp_path: Path) -> None:
    with SimServer(research_job.load("policy"), latency_s=0.5) as slow:
        agent = car_ray.recording(tmp_path, base_urls=BaseUrls.for_server(slow.url))(
            research_job.load("agent")
        )

        async def main() -> None:
            await asyncio.wait_for(agent({"question": QUESTIONS[0]}), timeout=0.2)

        with pytest.raises(TimeoutError):
            asyncio.run(main())
    (tape_path,) = tmp_path.glob("*.tape")
    tape = load_tape(tape_path)
    assert tape.seal is not None and tape.seal.error is not None
    assert tape.seal.error.type == "CancelledError"
    mark = read_mark(tape_path)
    assert mark is not None and mark.status == "aborted"
    assert car_ray.failing_tapes(tmp_path) == []


def test_listing_reports_unmarked_and_unreadable_marks_and_goes_on(
    support_job: Job, support: tuple[SimServer, SeenKeys], tmp_path: Path
) -> None:
    sim, _ = support
    agent = _recording(tmp_path, support_job, sim)(support_job.load("agent"))
    failed = agent.record(_ticket("T-1"), seed=BAD_SEED)
    spoiled = agent.record(_ticket("T-2"), seed=BAD_SEED)
    spoiled.path.with_name(spoiled.path.name.replace(".tape", ".mark.json")).write_text("{oops")
    (tmp_path / "20990101T000000-000000Z-deadbeef.tape").write_text("")  # a run still going

    listing = {entry.tape.name: entry for entry in marked_tapes(tmp_path)}
    assert listing[failed.path.name].mark is not None
    problem = listing[spoiled.path.name].problem
    assert problem is not None and spoiled.path.name.replace(".tape", ".mark.json") in problem
    assert "not a car-ray mark" in problem
    assert listing["20990101T000000-000000Z-deadbeef.tape"].problem is not None
    assert car_ray.failing_tapes(tmp_path) == [failed.path]

    # `since` keeps the runs started at or after it (in UTC).
    assert car_ray.failing_tapes(tmp_path, since=failed.started) == [failed.path]
    assert car_ray.failing_tapes(tmp_path, since=spoiled.started) == []
    with pytest.raises(ValueError, match="no timezone"):
        car_ray.failing_tapes(tmp_path, since=datetime(2025, 1, 1))
    with pytest.raises(FileNotFoundError, match="no such folder"):
        car_ray.failing_tapes(tmp_path / "missing")
    with pytest.raises(ValueError, match="local folder"):
        car_ray.recording("s3://bucket/traces")


KILLED_RUN = """
import sys
sys.path.insert(0, sys.argv[3])
import car_ray
from car_ray.replay import BaseUrls
from support_refund.agent import support_agent

agent = car_ray.recording(sys.argv[1], base_urls=BaseUrls.for_server(sys.argv[2]))(support_agent)
agent({"ticket_id": "T-1", "text": "Refund please."})
"""


def test_a_killed_process_leaves_an_incomplete_tape_that_is_not_listed(
    support_job: Job, tmp_path: Path
) -> None:
    with SimServer(support_job.load("policy"), latency_s=1.0) as slow:
        process = subprocess.Popen(
            [sys.executable, "-c", KILLED_RUN, str(tmp_path), slow.url, str(ROOT / "jobs")]
        )
        try:
            deadline = time.monotonic() + 60
            # SIGKILL once the first model call is on the tape and the second is waiting.
            while not any(b'"type":"llm"' in t.read_bytes() for t in tmp_path.glob("*.tape")):
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait()
    (tape_path,) = tmp_path.glob("*.tape")
    tape = load_tape(tape_path)
    # Whole lines up to the cut (the model call, maybe the tool after it), and no seal.
    assert tape.seal is None and tape.steps and tape.steps[0].type == "llm"
    assert len(tape.steps) <= 2
    assert car_ray.failing_tapes(tmp_path) == []
    (entry,) = marked_tapes(tmp_path)
    assert entry.mark is None and entry.problem is not None and "killed" in entry.problem
