"""Agents built on a framework, with one line of car-ray each (tests/framework_agents.py): the
OpenAI Agents SDK (its default Responses path, sync and async), LangGraph over ChatOpenAI,
LangChain's ChatAnthropic, pydantic-ai (chat completions and Responses) and an MCP server's
tools over stdio. Each records its model calls and its tool as steps, replays byte for byte,
forks the same whether its forks run one at a time or together, and is attributed right:
the weather answer (a coin flip, tests/matrix_agents.POLICY) is the step to blame."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from car_ray.job import load_job
from car_ray.replay import (
    BaseUrls,
    ForceAction,
    ForcedToolCall,
    ForkRunner,
    ForkSpec,
    Resample,
    record,
)
from car_ray.schedule import Budget
from car_ray.sim import SimServer
from car_ray.tape import Tape
from car_ray.truth import run_local

from . import framework_agents, matrix_agents
from .conftest import http_runner, run

NAMES = sorted(framework_agents.AGENTS)
FORK_SEEDS = range(12)
# The recording's seed: its answer (step 2) lands on "Bring an umbrella." (the bad outcome).
SEED = 2


@pytest.fixture(scope="module")
def sim() -> Any:
    with SimServer(matrix_agents.POLICY) as server:
        yield server


def _record(sim: SimServer, name: str, path: Path, **input: Any) -> Tape:
    tape, outcome = run(
        record(
            framework_agents.AGENTS[name],
            f"tests.framework_agents:{framework_agents.AGENTS[name].__name__}",
            input,
            path,
            base_urls=BaseUrls.for_server(sim.url),
            seed=SEED,
        )
    )
    assert outcome.error is None, outcome.error
    return tape


@pytest.fixture(scope="module")
def tapes(sim: SimServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Tape]:
    folder = tmp_path_factory.mktemp("frameworks")
    return {name: _record(sim, name, folder / f"{name}.tape") for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_a_framework_agent_records_and_replays_byte_for_byte(
    tapes: dict[str, Tape], name: str
) -> None:
    tape = tapes[name]
    assert [s.type for s in tape.steps] == ["llm", "tool", "llm"]
    assert tape.steps[1].name == "get_weather"  # type: ignore[union-attr]
    assert tape.steps[1].arguments["kwargs"] == {"city": "Oslo"}  # type: ignore[union-attr]
    runner = ForkRunner(
        framework_agents.AGENTS[name],
        matrix_agents.umbrella,
        base_urls=BaseUrls.for_server("http://127.0.0.1:9"),  # nothing listens: no network
    )
    runner.add_tape(tape)
    try:
        replayed = run(runner.replay(tape.tape_id))
    finally:
        run(runner.aclose())
    assert tape.seal is not None and replayed.result == tape.seal.result
    assert [e["source"] for e in replayed.trajectory] == ["replay"] * 3


@pytest.mark.parametrize("name", NAMES)
def test_concurrent_forks_equal_one_at_a_time_forks(
    sim: SimServer, tapes: dict[str, Tape], name: str
) -> None:
    tape = tapes[name]
    specs = [
        ForkSpec(tape_id=tape.tape_id, interventions={2: Resample()}, tail="held", seed=s)
        for s in FORK_SEEDS
    ]

    async def go() -> tuple[list[Any], list[Any]]:
        runner = http_runner(framework_agents.AGENTS[name], matrix_agents.umbrella, sim, tape)
        try:
            alone = [await runner.run(spec) for spec in specs]
            together = await asyncio.gather(*(runner.run(spec) for spec in specs))
        finally:
            await runner.aclose()
        return alone, list(together)

    alone, together = run(go())
    assert all(r.status == "ok" for r in alone), alone[0]
    same = [r.model_dump(exclude={"latency_s"}) for r in alone]
    assert same == [r.model_dump(exclude={"latency_s"}) for r in together]
    # A coin flip at step 2: 6 of 12 expected; none or all is a 1-in-2048 event (the seeds
    # are fixed, so this either holds or names a fork that does not draw).
    assert 1 <= sum(bool(r.flipped) for r in alone) <= 11


@pytest.mark.parametrize("name", NAMES)
def test_a_framework_agent_is_attributed_to_its_answer(
    tapes: dict[str, Tape], name: str, tmp_path: Path
) -> None:
    """The default job: the answer (step 2) separated as the one step to blame; the tool
    call (step 0) and the tool never chose anything."""
    folder = tmp_path / "job"
    folder.mkdir()
    agent = framework_agents.AGENTS[name].__name__
    (folder / "job.toml").write_text(
        f'agent = "tests.framework_agents:{agent}"\n'
        'scorer = "tests.matrix_agents:umbrella"\n'
        'policy = "tests.matrix_agents:POLICY"\n'
        "[[interventions]]\n"
        'kind = "resample"\n'
    )
    job = load_job(folder / "job.toml")
    tape = tapes[name]
    assert tape.seal is not None and matrix_agents.umbrella(tape.seal.result, []) == 1.0
    outcome, _ = run_local(job, tape, Budget(max_forks=60))
    assert outcome.answer is not None
    assert (outcome.answer.kind, outcome.answer.top) == ("separated", [2])


@pytest.mark.parametrize("name", ["agents_sdk", "mcp"])
def test_a_tools_effect_flag_is_kept_and_an_effect_never_runs_in_a_fork(
    sim: SimServer, tmp_path: Path, name: str
) -> None:
    tape = _record(sim, name, tmp_path / "effect.tape", effects=["get_weather"])
    assert tape.steps[1].effect is True  # type: ignore[union-attr]
    executed = len(matrix_agents.EXECUTED)
    other_city = ForceAction(
        tool_calls=[ForcedToolCall(name="get_weather", arguments={"city": "Bergen"})]
    )

    async def go() -> Any:
        runner = http_runner(framework_agents.AGENTS[name], matrix_agents.umbrella, sim, tape)
        try:
            return await runner.run(ForkSpec(tape_id=tape.tape_id, interventions={0: other_city}))
        finally:
            await runner.aclose()

    row = run(go())
    assert (row.status, row.blocked_effect) == ("blocked_effect", "get_weather")
    assert len(matrix_agents.EXECUTED) == executed


def test_a_recorded_tool_outside_a_run_is_the_plain_function() -> None:
    assert framework_agents.get_weather("Oslo")["forecast"] == "rain"
    assert framework_agents.get_weather.__name__ == "get_weather"
    assert "city" in str(__import__("inspect").signature(framework_agents.get_weather))
