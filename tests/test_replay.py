"""Record then replay, for both SDKs, sync and async, streaming and not."""

from __future__ import annotations

from pathlib import Path

import pytest

from car_ray.replay import (
    BaseUrls,
    DivergenceError,
    ForkRunner,
    ForkSpec,
    Probe,
    Resample,
    record,
)
from car_ray.sim import SimServer
from car_ray.tape import LlmEvent, Tape, load_tape

from . import matrix_agents
from .conftest import http_runner, run

CASES = [
    (provider, style, stream)
    for provider in ("openai", "anthropic", "responses")
    for style in ("sync", "async")
    for stream in (False, True)
]
SECRET = "sk-test-SECRET-9f8e7d"


@pytest.fixture(scope="module")
def sim() -> SimServer:
    with SimServer(matrix_agents.POLICY) as server:
        yield server  # type: ignore[misc]


def _record(sim: SimServer, tmp_path: Path, provider: str, style: str, stream: bool) -> Tape:
    agent = matrix_agents.AGENTS[(provider, style)]
    tape, outcome = run(
        record(
            agent,
            f"tests.matrix_agents:{agent.__name__}",
            {"stream": stream},
            tmp_path / "run.tape",
            base_urls=BaseUrls.for_server(sim.url),
            seed=11,
            api_keys={"openai": SECRET, "anthropic": SECRET},
        )
    )
    assert outcome.error is None, outcome.error
    return tape


@pytest.mark.parametrize(("provider", "style", "stream"), CASES)
def test_record_then_replay_is_faithful(
    sim: SimServer, tmp_path: Path, provider: str, style: str, stream: bool
) -> None:
    tape = _record(sim, tmp_path, provider, style, stream)
    llm = [e for e in tape.steps if isinstance(e, LlmEvent)]
    assert [e.type for e in tape.steps] == ["llm", "tool", "llm"]
    assert {e.provider for e in llm} == {"openai" if provider == "responses" else provider}
    assert all(e.response.stream is stream for e in llm)
    assert all(e.usage["input_tokens"] > 0 for e in llm)
    if stream:
        assert llm[0].response.body_text is not None
        assert "data:" in llm[0].response.body_text

    served = sim.requests_served
    runner = ForkRunner(
        matrix_agents.AGENTS[(provider, style)],
        matrix_agents.umbrella,
        base_urls=BaseUrls.for_server("http://127.0.0.1:9"),  # nothing listens: no network
    )
    runner.add_tape(tape)
    replayed = run(runner.replay(tape.tape_id))
    assert tape.seal is not None
    # Same result, including the recorded clock, uuid and random draws.
    assert replayed.result == tape.seal.result
    assert [e["source"] for e in replayed.trajectory] == ["replay", "replay", "replay"]
    assert sim.requests_served == served, "a replay must not call the provider"


@pytest.mark.parametrize(("provider", "style", "stream"), CASES)
def test_no_api_key_or_auth_header_reaches_the_tape(
    sim: SimServer, tmp_path: Path, provider: str, style: str, stream: bool
) -> None:
    tape = _record(sim, tmp_path, provider, style, stream)
    raw = tape.path.read_text().lower()
    assert SECRET.lower() not in raw
    for header in ("authorization", "x-api-key", "bearer"):
        assert header not in raw


@pytest.mark.parametrize(("provider", "style"), [("openai", "sync"), ("anthropic", "async")])
def test_editing_the_prompt_diverges_at_the_exact_step(
    sim: SimServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str, style: str
) -> None:
    tape = _record(sim, tmp_path, provider, style, stream=False)
    monkeypatch.setattr(matrix_agents, "FOLLOWUP", "Answer in two sentences.")
    runner = ForkRunner(
        matrix_agents.AGENTS[(provider, style)],
        matrix_agents.umbrella,
        base_urls=BaseUrls.for_server("http://127.0.0.1:9"),
    )
    runner.add_tape(tape)
    with pytest.raises(DivergenceError) as caught:
        run(runner.replay(tape.tape_id))
    error = caught.value
    assert error.step == 2  # the second model call is the first to carry FOLLOWUP
    assert error.differences, "the divergence names what differs"
    where = error.differences[0]
    assert where.path.startswith("$.messages[")
    assert "one sentence" in where.expected
    assert "two sentences" in where.observed
    assert "step 2" in str(error)


def test_a_forks_tail_goes_over_http_and_the_same_seed_gives_the_same_row(
    sim: SimServer, tmp_path: Path
) -> None:
    tape = _record(sim, tmp_path, "openai", "sync", stream=True)

    async def go() -> list[object]:
        runner = http_runner(matrix_agents.openai_agent, matrix_agents.umbrella, sim, tape)
        try:
            rows = []
            for seed in (5, 5, 6):
                before = sim.requests_served
                row = await runner.run(
                    ForkSpec(tape_id=tape.tape_id, interventions={2: Resample()}, seed=seed)
                )
                assert row.tail_calls == 1
                assert sim.requests_served == before + 1
                rows.append(row.model_dump(exclude={"latency_s"}))
            return rows
        finally:
            await runner.aclose()

    first, again, _other = run(go())
    assert first == again


def test_replay_of_a_truncated_tape_is_refused(sim: SimServer, tmp_path: Path) -> None:
    tape = _record(sim, tmp_path, "openai", "sync", stream=False)
    lines = tape.path.read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut.tape"
    cut.write_bytes(b"".join(lines[:-1]))
    loaded = load_tape(cut)
    runner = ForkRunner(
        matrix_agents.openai_agent, matrix_agents.umbrella, base_urls=BaseUrls.for_server(sim.url)
    )
    with pytest.raises(ValueError, match="incomplete"):
        runner.add_tape(loaded)


def test_a_probed_model_call_at_its_recorded_request_after_the_run_left_the_tape_is_held(
    tmp_path: Path,
) -> None:
    """A probe draws afresh only while the run is on the tape. The agent asks the same
    question twice, so its second request is the recorded one whatever the first answer:
    after a re-drawn first answer that left the tape, the probed second call keeps its
    mechanism (the recorded answer, from the tape); on the tape it goes live."""
    with SimServer(matrix_agents.CoinPolicy()) as coin:
        tape, outcome = run(
            record(
                matrix_agents.ask_twice,
                "tests.matrix_agents:ask_twice",
                {},
                tmp_path / "twice.tape",
                base_urls=BaseUrls.for_server(coin.url),
                seed=3,
            )
        )
        assert outcome.error is None, outcome.error

        async def go() -> list[tuple[int | None, str]]:
            runner = http_runner(matrix_agents.ask_twice, matrix_agents.second_tails, coin, tape)
            out = []
            try:
                for seed in range(16):
                    spec = ForkSpec(
                        tape_id=tape.tape_id,
                        interventions={0: Resample(), 1: Probe()},
                        tail="held",
                        seed=seed,
                    )
                    row, trajectory = await runner.fork(spec)
                    out.append((row.first_deviation, str(trajectory[1]["source"])))
            finally:
                await runner.aclose()
            return out

        forks = run(go())
    left = {source for first, source in forks if first == 0}
    stayed = {source for first, source in forks if first != 0}
    assert left == {"held"} and stayed == {"live"}, forks
