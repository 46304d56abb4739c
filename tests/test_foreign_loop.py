"""A sync agent that runs its own event loop (`asyncio.run` inside, as a framework's
`run_sync` does) while using `ctx.async_openai()`: its calls are served on the run's loop,
recorded, replayed and forked concurrently like any other agent's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import car_ray
from car_ray.replay import (
    AiohttpUpstream,
    BaseUrls,
    ForkRunner,
    ForkSpec,
    Resample,
    record,
)
from car_ray.sim import SimServer

from . import matrix_agents
from .conftest import run


def run_sync_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    """Sync on the outside; an async SDK client on a loop of its own inside."""
    return asyncio.run(matrix_agents.async_openai_agent(ctx))


def test_a_sync_agent_on_its_own_loop_records_replays_and_forks(tmp_path: Path) -> None:
    with SimServer(matrix_agents.POLICY) as sim:
        urls = BaseUrls.for_server(sim.url)
        tape, outcome = run(
            record(
                run_sync_agent,
                "tests.test_foreign_loop:run_sync_agent",
                {"stream": False},
                tmp_path / "run.tape",
                base_urls=urls,
                seed=11,
            )
        )
        assert outcome.error is None, outcome.error
        assert [e.type for e in tape.steps] == ["llm", "tool", "llm"]

        async def forks() -> list[Any]:
            runner = ForkRunner(
                run_sync_agent,
                matrix_agents.umbrella,
                base_urls=urls,
                upstream=AiohttpUpstream(),
                max_threads=16,
            )
            runner.add_tape(tape)
            try:
                replayed = await runner.replay(tape.tape_id)
                assert tape.seal is not None and replayed.result == tape.seal.result
                specs = [
                    ForkSpec(tape_id=tape.tape_id, interventions={0: Resample()}, seed=s)
                    for s in range(32)
                ]
                # One after another: each agent's loop is new, the pooled connections are
                # not (before, a connection an earlier loop opened failed the next fork with
                # "attached to a different loop")...
                rows = [await runner.run(s) for s in specs[:8]]
                # ...and many at once, each agent thread on a loop of its own.
                batch = asyncio.gather(*(runner.run(s) for s in specs[8:]))
                return rows + list(await asyncio.wait_for(batch, 60))
            finally:
                await runner.aclose()

        rows = run(forks())
    assert [r.status for r in rows] == ["ok"] * len(rows), [r.error for r in rows if r.error]
    assert all(r.tail_calls >= 1 for r in rows)
