"""No silent answer from a call car-ray could not read: a recording refuses a model call it
cannot read (naming the step, the method and the path), a client built without ctx fails
with the fix and ends the recording, `attribute` refuses a tape without a model step, and
`record --until-bad` stops at the agent's first error."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import openai
import pytest
from typer.testing import CliRunner

import car_ray
from car_ray.attribute import check_tape
from car_ray.cli import FRAMEWORK_CALLS, app, unrecorded_calls
from car_ray.job import load_job
from car_ray.replay import BaseUrls, RecordingRefused, Tripwire, record
from car_ray.sim import SimServer
from car_ray.tape import load_tape

from . import matrix_agents
from .conftest import ROOT, run

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


def _weather(ctx: car_ray.AgentContext, recorded: bool) -> dict[str, Any]:
    """The weather agent, its tool run through ctx.tool (a tool step) or as a plain function."""
    client = ctx.openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": matrix_agents.SYSTEM},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    _, calls = matrix_agents._openai_turn(client, messages, False)
    call = calls[0]
    arguments = json.loads(call.function.arguments)
    if recorded:
        weather = ctx.tool(call.function.name, matrix_agents.get_weather, **arguments)
    else:
        weather = matrix_agents.get_weather(**arguments)
    messages.append({"role": "assistant", "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(weather)})
    answer, _ = matrix_agents._openai_turn(client, messages, False)
    return {"answer": answer}


def tool_outside_car_ray(ctx: car_ray.AgentContext) -> dict[str, Any]:
    return _weather(ctx, recorded=False)


def tool_inside_car_ray(ctx: car_ray.AgentContext) -> dict[str, Any]:
    return _weather(ctx, recorded=True)


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


def test_record_names_a_tool_the_model_called_that_car_ray_did_not_record(
    sim: SimServer, tmp_path: Path
) -> None:
    """A tool run as a plain function (a framework's own tool decorator, without
    @car_ray.tool) leaves no tool step: it would run live in every fork and could not be
    replaced. `record` names it and the fix; a tool recorded with ctx.tool is not named."""
    tape, _ = _record(sim, tool_outside_car_ray, tmp_path / "plain.tape")
    assert [s.type for s in tape.steps] == ["llm", "llm"]
    assert unrecorded_calls(tape) == [(0, "get_weather")]
    recorded, _ = _record(sim, tool_inside_car_ray, tmp_path / "recorded.tape")
    assert [s.type for s in recorded.steps] == ["llm", "tool", "llm"]
    assert unrecorded_calls(recorded) == []
    # Calls a framework answers itself are no tool the agent runs.
    assert FRAMEWORK_CALLS.match("transfer_to_billing") and FRAMEWORK_CALLS.match("final_result")
    assert not FRAMEWORK_CALLS.match("get_weather")
    job = _job(tmp_path, "tool_outside_car_ray")
    done = cli.invoke(app, ["record", str(job)], env={"COLUMNS": "400"})
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert (
        "warning: the model called get_weather (step(s) 0) and no tool step was recorded "
        "before its next call" in said
    ), said
    assert "define it with @car_ray.tool" in said


def _job(tmp_path: Path, agent: str, **extra: str) -> Path:
    folder = tmp_path / "silent_job"
    folder.mkdir(exist_ok=True)
    (folder / "agent.py").write_text(
        "from tests.test_silent import always_raises, tools_only  # noqa: F401\n"
        "from tests.test_silent import tool_outside_car_ray  # noqa: F401\n"
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


# -- nothing traced off the machine ---------------------------------------------------------------

# A recording, or forks of one, in a fresh process (as `car-ray record` and a Ray worker run
# them): its agent, and a proxy that every HTTPS request but the simulated provider's meets.
_TRACED = """
import sys
from pathlib import Path
from car_ray.replay import BaseUrls, ForkSpec, RecordingRefused, Resample, record
from car_ray.sim import SimServer
from car_ray.tape import load_tape
from tests import framework_agents, matrix_agents
from tests.conftest import http_runner, run

def around(ctx):
    from agents import Runner
    # The Agents SDK without car-ray's integration: its default client meets the tripwire.
    return Runner.run_sync(framework_agents._agents_sdk_agent(), "Weather in Oslo?").final_output

name, path, what = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
agent = {"around": around, "langgraph": framework_agents.langgraph}[name]
with SimServer(matrix_agents.POLICY) as sim:
    urls = BaseUrls.for_server(sim.url)
    if what == "record":
        try:
            run(record(agent, "traced:" + name, {}, path, base_urls=urls, seed=1))
            print("recorded")
        except RecordingRefused as exc:
            print("refused:", exc)
    else:
        runner = http_runner(agent, matrix_agents.umbrella, sim, load_tape(path))
        tape_id = load_tape(path).tape_id
        specs = [ForkSpec(tape_id=tape_id, interventions={0: Resample()}, seed=s)
                 for s in range(3)]
        rows = [run(runner.run(spec)) for spec in specs]
        run(runner.aclose())
        print("forked", sum(r.outcome is not None for r in rows))
"""


class _Proxy:
    """An HTTP proxy that answers nothing: the first line of every request it is sent."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    self.lines.append(conn.recv(4096).decode(errors="replace").split("\r\n")[0])


@pytest.mark.parametrize(
    ("agent", "what"), [("around", "record"), ("langgraph", "record"), ("langgraph", "fork")]
)
def test_no_framework_traces_a_recording_or_a_fork_off_the_machine(
    agent: str, what: str, tmp_path: Path
) -> None:
    """The Agents SDK exports every run's spans with the user's OPENAI_API_KEY to a fixed URL,
    even when its model calls meet the tripwire; LangSmith, switched on in the user's
    environment, sends every run. While car-ray records or forks an agent neither sends
    anything: the proxy every outside request goes through sees none."""
    proxy = _Proxy()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "HTTPS_PROXY": proxy.url,
        "HTTP_PROXY": proxy.url,
        "NO_PROXY": "127.0.0.1,localhost",
        "OPENAI_API_KEY": "sk-test-never-sent",
        "LANGSMITH_TRACING": "true",
        "LANGCHAIN_TRACING_V2": "true",
        "LANGSMITH_API_KEY": "lsv2-test-never-sent",
    }
    env.pop("OPENAI_AGENTS_DISABLE_TRACING", None)

    def python(step: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", _TRACED, agent, str(tmp_path / "run.tape"), step],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]  # after the log lines

    said = python("record")
    if what == "fork":
        proxy.lines.clear()  # the forks' own process, from its start
        said = python("fork")
    # It ran: the plain Agents SDK run met the tripwire, the LangGraph agent recorded and
    # its forks scored.
    expected = {"around": "refused:", "langgraph": "recorded" if what == "record" else "forked 3"}
    assert said.startswith(expected[agent]), said
    assert proxy.lines == [], proxy.lines
