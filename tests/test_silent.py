"""No silent answer from a call car-ray could not read: a recording refuses a model call it
cannot read (naming the step, the method and the path), a client built without ctx fails
with the fix and ends the recording, `attribute` refuses a tape without a model step, and
`record --until-bad` stops at the agent's first error."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

import car_ray
from car_ray.attribute import check_tape
from car_ray.cli import app
from car_ray.job import load_job
from car_ray.replay import BaseUrls, RecordingRefused, Tripwire, record
from car_ray.sim import SimServer
from car_ray.tape import load_tape

from . import matrix_agents
from .conftest import run

cli = CliRunner()


def embeds_then_answers(ctx: car_ray.AgentContext) -> str:
    """A call through ctx's client to an endpoint car-ray does not read as a model step."""
    client = ctx.openai()
    client.embeddings.create(model="text-embedding-3-small", input="Weather in Oslo?")
    return "done"


def own_client(ctx: car_ray.AgentContext) -> str:
    """A model call through a client built without ctx, its error swallowed by the agent."""
    ctx.tool("get_weather", matrix_agents.get_weather, city="Oslo")
    try:
        openai.OpenAI(api_key="sk-test", max_retries=0).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Weather?"}]
        )
    except openai.APIError as exc:
        return f"swallowed: {exc}"
    return "answered"


def tools_only(ctx: car_ray.AgentContext) -> dict[str, Any]:
    return ctx.tool("get_weather", matrix_agents.get_weather, city="Oslo")


def always_raises(ctx: car_ray.AgentContext) -> str:
    ctx.tool("get_weather", matrix_agents.get_weather, city="Oslo")
    raise RuntimeError("the agent broke at its second step")


@pytest.fixture(scope="module")
def sim() -> Any:
    with SimServer(matrix_agents.POLICY) as server:
        yield server


def _record(sim: SimServer, agent: Any, path: Path) -> Any:
    return run(
        record(
            agent,
            f"tests.test_silent:{agent.__name__}",
            {},
            path,
            base_urls=BaseUrls.for_server(sim.url),
            seed=1,
        )
    )


def test_a_call_car_ray_cannot_read_ends_the_recording_with_its_path(
    sim: SimServer, tmp_path: Path
) -> None:
    tape = tmp_path / "embeds.tape"
    with pytest.raises(RecordingRefused) as refused:
        _record(sim, embeds_then_answers, tape)
    message = str(refused.value)
    assert "step 0: POST /v1/embeddings is not a model call car-ray reads" in message
    assert "POST .../responses" in message and "ctx.openai()" in message
    # The tape is kept, sealed with the error, and has no step that "answered nothing".
    kept = load_tape(tape)
    assert kept.steps == [] and kept.seal is not None and kept.seal.error is not None
    assert kept.seal.error.type == "UnreadableCall"


def test_a_client_built_without_ctx_fails_with_the_fix_and_ends_the_recording(
    sim: SimServer, tmp_path: Path
) -> None:
    before = {name: os.environ.get(name) for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")}
    with pytest.raises(RecordingRefused) as refused:
        _record(sim, own_client, tmp_path / "own.tape")
    assert "POST /v1/chat/completions went around car-ray's transport" in str(refused.value)
    tape = load_tape(tmp_path / "own.tape")
    # The agent swallowed the error (which named the fix): the tape is sealed refused all
    # the same, and attribute will not take it.
    assert tape.seal is not None and tape.seal.error is not None
    assert tape.seal.error.type == "UnreadableCall"
    assert "went around car-ray" in tape.seal.error.message
    assert [s.type for s in tape.steps] == ["tool"]
    job = load_job(_job(tmp_path, "tools_only"))
    with pytest.raises(ValueError, match="its recording was refused"):
        check_tape(job, tape)
    # The environment is the caller's again once the recording is over.
    assert {name: os.environ.get(name) for name in before} == before
    assert Tripwire._users == 0


def _job(tmp_path: Path, agent: str, **extra: str) -> Path:
    folder = tmp_path / "silent_job"
    folder.mkdir(exist_ok=True)
    (folder / "agent.py").write_text(
        "from tests.test_silent import always_raises, tools_only  # noqa: F401\n"
        "from tests.matrix_agents import umbrella  # noqa: F401\n"
    )
    lines = [
        f'agent = "silent_job.agent:{agent}"',
        'scorer = "silent_job.agent:umbrella"',
        'policy = "tests.matrix_agents:POLICY"',
        'tape = "run.tape"',
        *(f"{k} = {v}" for k, v in extra.items()),
    ]
    (folder / "job.toml").write_text("\n".join(lines) + "\n")
    return folder / "job.toml"


def test_attribute_refuses_a_tape_without_a_model_step(tmp_path: Path) -> None:
    job = _job(tmp_path, "tools_only")
    recorded = cli.invoke(app, ["record", str(job)])
    assert recorded.exit_code == 0, recorded.output
    refused = cli.invoke(app, ["attribute", str(job), "--out", str(tmp_path / "out")])
    assert refused.exit_code == 2, refused.output
    assert "has no model step (1 tool steps)" in refused.output
    assert "ctx.openai()" in refused.output
    assert not (tmp_path / "out").exists()


def test_record_until_bad_stops_at_the_agents_first_error(tmp_path: Path) -> None:
    job = _job(tmp_path, "always_raises")
    result = cli.invoke(app, ["record", str(job), "--until-bad", "--tries", "5"])
    assert result.exit_code == 1, result.output
    assert "the agent raised RuntimeError('the agent broke at its second step')" in result.output
    assert "--until-bad stops at an agent's error" in result.output
    assert "recording again" not in result.output  # one try, not five


@car_ray.tool(effect=True)
def send_email(to: str) -> str:
    SENT.append(to)
    return f"sent to {to}"


SENT: list[str] = []


def emails_from_a_plain_thread(ctx: car_ray.AgentContext) -> str:
    """Calls an effect tool from a thread that did not copy the run's context."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(send_email, "a@example.com").result()


def test_an_effect_tool_that_lost_its_run_refuses_to_run(sim: SimServer, tmp_path: Path) -> None:
    """Called from a plain thread (no context copied) while a run is live, an effect tool
    refuses; outside any run it is the plain function."""
    _, outcome = _record(sim, emails_from_a_plain_thread, tmp_path / "mail.tape")
    assert isinstance(outcome.error, RuntimeError)
    assert "'send_email' (effect=True) was called outside its run's context" in str(outcome.error)
    assert SENT == []
    assert send_email("b@example.com") == "sent to b@example.com" and SENT == ["b@example.com"]
