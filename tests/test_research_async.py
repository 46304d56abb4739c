"""The research demo job: an async, streaming anthropic agent, recorded, replayed and forked
against the simulated provider over real HTTP, with flip-rates checked against exact values."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from car_ray.job import Job, load_job
from car_ray.replay import (
    AiohttpUpstream,
    BaseUrls,
    ForkRow,
    ForkRunner,
    ForkSpec,
    Resample,
)
from car_ray.sim import SimServer
from car_ray.tape import LlmEvent, Tape, ToolEvent, load_tape

from .conftest import RESEARCH_JOB, record_job, run

SEEDS = range(1000, 1032)
# A binomial count of n forks lies within 4 standard deviations of n * p, or the test fails:
# by the normal approximation a false alarm about once in 16,000 seed sets; the seeds are
# fixed, so the verdict is too.
SIGMAS = 4.0


@pytest.fixture(scope="module")
def job() -> Job:
    return load_job(RESEARCH_JOB)


@pytest.fixture(scope="module")
def policy(job: Job) -> Any:
    return job.load("policy")


@pytest.fixture(scope="module")
def scenario(policy: Any) -> ModuleType:
    """The policy's module: its probabilities, and the corpus urls it imports from the agent."""
    return sys.modules[type(policy).__module__]


@pytest.fixture(scope="module")
def sim(policy: Any) -> Iterator[SimServer]:
    with SimServer(policy) as server:
        yield server


@pytest.fixture(scope="module")
def tape_path(job: Job, sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_job(job, sim, tmp_path_factory.mktemp("research") / "research.tape").path


@pytest.fixture(scope="module")
def tape(tape_path: Path) -> Tape:
    return load_tape(tape_path)


def runner_for(job: Job, sim: SimServer | None, tape: Tape) -> ForkRunner:
    """A runner with the job's agent and scorer: live over HTTP to `sim`, or replay-only."""
    runner = ForkRunner(
        job.load("agent"),
        job.load("scorer"),
        # Replay-only runners never connect: the URL just has to be well formed.
        base_urls=BaseUrls.for_server(sim.url if sim else "http://127.0.0.1:9"),
        upstream=AiohttpUpstream() if sim else None,
    )
    runner.add_tape(tape)
    return runner


async def run_forks(job: Job, sim: SimServer, tape: Tape, specs: list[ForkSpec]) -> list[ForkRow]:
    runner = runner_for(job, sim, tape)
    try:
        return list(await asyncio.gather(*(runner.run(spec) for spec in specs)))
    finally:
        await runner.aclose()


def test_recording_is_a_streaming_anthropic_run_that_cites_the_blog(
    job: Job, tape: Tape, scenario: ModuleType
) -> None:
    assert len(tape.steps) >= 6
    llm = [e for e in tape.steps if isinstance(e, LlmEvent)]
    tools = [e for e in tape.steps if isinstance(e, ToolEvent)]
    assert llm and tools
    assert all(e.provider == "anthropic" and e.response.stream for e in llm)
    assert all(e.model == "claude-haiku-4-5" for e in llm)
    assert [e.name for e in tools] == ["search", "fetch", "fetch", "submit_answer"]
    assert {e.kind for e in tape.nondet} == {"now", "uuid4"}
    # The job's seed records the bad path: encyclopedia, then the blog, then trusting it.
    assert [e.arguments["kwargs"].get("url") for e in tools[1:3]] == [
        scenario.ENCYCLOPEDIA,
        scenario.BLOG,
    ]
    assert tape.seal is not None
    assert scenario.BLOG in tape.seal.result["sources"]
    runner = runner_for(job, None, tape)
    assert runner.recorded_outcome(tape.tape_id) == 1.0


def test_replay_is_faithful_and_offline(job: Job, sim: SimServer, tape: Tape) -> None:
    async def go() -> Any:
        runner = runner_for(job, None, tape)
        try:
            return await runner.replay(tape.tape_id)
        finally:
            await runner.aclose()

    served = sim.requests_served
    outcome = run(go())
    assert outcome.error is None
    assert tape.seal is not None
    assert outcome.result == tape.seal.result
    assert [s["source"] for s in outcome.trajectory] == ["replay"] * len(tape.steps)
    assert sim.requests_served == served


def exact_flip_rates(scenario: ModuleType) -> dict[int, float]:
    """P(the outcome flips to good | resample step k, live tail), by hand from the policy,
    on the recorded path (E = encyclopedia, S = survey, B = blog; E read first, then B)."""
    e, b, s = scenario.ENCYCLOPEDIA, scenario.BLOG, scenario.SURVEY
    first, second = scenario.P_FIRST, scenario.P_SECOND
    trust_first, trust_second = scenario.P_TRUST_BLOG_FIRST, scenario.P_TRUST_BLOG_SECOND
    # A fresh run is bad only through the blog: read first, or read second after E or S.
    p_bad = (
        first[b] * trust_first
        + first[e] * second[e][b] * trust_second
        + first[s] * second[s][b] * trust_second
    )
    return {
        # Step 2 picks the first page: everything after it is redrawn.
        2: 1 - p_bad,
        # Step 4 picks the second page after E: S is good; B is bad if trusted.
        4: 1 - second[e][b] * trust_second,
        # Step 6 answers with the blog read second: it trusts it or not.
        6: 1 - trust_second,
    }


def test_exact_flip_rates_by_hand(scenario: ModuleType) -> None:
    # p_bad = 0.3 * 0.7 + 0.5 * 0.4 * 0.4 + 0.2 * 0.3 * 0.4 = 0.21 + 0.08 + 0.024 = 0.314
    # step 4: 1 - 0.4 * 0.4 = 0.84; step 6: 1 - 0.4 = 0.6
    assert exact_flip_rates(scenario) == pytest.approx({2: 0.686, 4: 0.84, 6: 0.6})


@pytest.mark.parametrize("step", [2, 4, 6])
def test_resample_flip_rate_matches_the_policy(
    job: Job, sim: SimServer, tape: Tape, scenario: ModuleType, step: int
) -> None:
    p = exact_flip_rates(scenario)[step]
    specs = [
        ForkSpec(tape_id=tape.tape_id, interventions={step: Resample()}, seed=seed)
        for seed in SEEDS
    ]
    again = ForkSpec(tape_id=tape.tape_id, interventions={step: Resample()}, seed=SEEDS[0])
    rows = run(run_forks(job, sim, tape, [*specs, again]))
    rows, rerun = rows[:-1], rows[-1]
    assert {r.status for r in rows} == {"ok"}, [r.error or r.divergence for r in rows]
    assert all(r.steps_intervened == [step] and r.tail_calls >= 1 for r in rows)
    n = len(rows)
    flips = sum(bool(r.flipped) for r in rows)
    tolerance = SIGMAS * math.sqrt(n * p * (1 - p))
    assert abs(flips - n * p) <= tolerance, f"{flips}/{n} flipped; exact p = {p:.3f}"
    assert rerun.model_dump(exclude={"latency_s"}) == rows[0].model_dump(exclude={"latency_s"})


def test_forks_go_over_http(job: Job, sim: SimServer, tape: Tape) -> None:
    specs = [
        ForkSpec(tape_id=tape.tape_id, interventions={k: Resample()}, seed=seed)
        for k in range(len(tape.steps))
        for seed in range(3)
    ]
    before = sim.requests_served
    rows = run(run_forks(job, sim, tape, specs))
    assert {r.status for r in rows} == {"ok"}
    tail_calls = sum(r.tail_calls for r in rows)
    assert tail_calls > 0
    assert sim.requests_served - before == tail_calls
