"""The simulated provider, seen through the real openai and anthropic SDKs over real HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from car_ray.providers import Action, ChatRequest, Message, ToolCall, estimate_usage
from car_ray.sim import (
    PolicyError,
    SimProcess,
    SimServer,
    distribution_of,
    draw,
    uniform_for_seed,
)

P_TOOL = 0.3
PROMPT = "Where is my order A-17?"
TOOL_ACTION = Action(tool_calls=(ToolCall("lookup_order", {"order_id": "A-17", "verbose": True}),))
TEXT_ACTION = Action(text="I cannot see your order yet; it usually ships within two working days.")
AFTER_TOOL = Action(text="Order A-17 shipped yesterday and arrives on Friday.")

OPENAI_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look an order up by id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "verbose": {"type": "boolean"}},
                "required": ["order_id"],
            },
        },
    }
]
ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": "lookup_order",
        "description": "Look an order up by id.",
        "input_schema": OPENAI_TOOLS[0]["function"]["parameters"],
    }
]


class ToolOrAnswer:
    """Looks the order up with probability P_TOOL, else answers; answers once a result is in."""

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        if any(m.role == "tool" for m in request.messages):
            return [(1.0, AFTER_TOOL)]
        return [(P_TOOL, TOOL_ACTION), (1 - P_TOOL, TEXT_ACTION)]


class Leaky:
    """Broken on purpose: its probabilities sum to 0.9."""

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        return [(0.5, TEXT_ACTION), (0.4, TOOL_ACTION)]


# Seeds whose common random number lands on each branch, found from the ground truth itself.
TOOL_SEED = next(s for s in range(1000) if uniform_for_seed(s) < P_TOOL)
TEXT_SEED = next(s for s in range(1000) if uniform_for_seed(s) >= P_TOOL)


def seeded(seed: int) -> dict[str, str]:
    return {"x-car-ray-seed": str(seed)}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(ToolOrAnswer()) as server:
        yield server


@pytest.fixture(scope="module")
def oai(sim: SimServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sim.openai_base_url, api_key="sk-test", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def claude(sim: SimServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=sim.anthropic_base_url, api_key="sk-test", max_retries=0
    ) as client:
        yield client


def ask_openai(client: openai.OpenAI, seed: int) -> Any:
    return client.chat.completions.create(
        model="gpt-sim",
        messages=[{"role": "user", "content": PROMPT}],
        tools=OPENAI_TOOLS,
        extra_headers=seeded(seed),
    )


def ask_anthropic(client: anthropic.Anthropic, seed: int) -> Any:
    return client.messages.create(
        model="claude-sim",
        max_tokens=256,
        messages=[{"role": "user", "content": PROMPT}],
        tools=ANTHROPIC_TOOLS,
        extra_headers=seeded(seed),
    )


def openai_action(completion: Any) -> Action:
    message = completion.choices[0].message
    calls = tuple(
        ToolCall(c.function.name, json.loads(c.function.arguments))
        for c in message.tool_calls or []
    )
    # A stream's opening delta carries content "", so a tool-only answer accumulates "", not None.
    return Action(text=message.content or None, tool_calls=calls)


def anthropic_action(message: Any) -> Action:
    text = "".join(b.text for b in message.content if b.type == "text")
    calls = tuple(ToolCall(b.name, b.input) for b in message.content if b.type == "tool_use")
    return Action(text=text or None, tool_calls=calls)


def http(method: str, url: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


# --- the policy helpers -------------------------------------------------------------------


def test_draw_inverts_the_cdf_and_seeds_give_fixed_uniforms() -> None:
    distribution = [(0.25, TOOL_ACTION), (0.75, TEXT_ACTION)]
    assert draw(distribution, 0.0) == TOOL_ACTION
    assert draw(distribution, 0.2499) == TOOL_ACTION
    assert draw(distribution, 0.25) == TEXT_ACTION
    assert draw(distribution, math.nextafter(1.0, 0.0)) == TEXT_ACTION
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        draw(distribution, 1.0)
    assert uniform_for_seed(7) == uniform_for_seed(7) != uniform_for_seed(8)
    assert all(0.0 <= uniform_for_seed(s) < 1.0 for s in range(1000))


def test_a_distribution_that_does_not_sum_to_one_names_the_policy() -> None:
    request = ChatRequest(provider="openai", model="m", messages=(Message("user", PROMPT),))
    with pytest.raises(PolicyError, match=r"Leaky: probabilities sum to 0\.9"):
        distribution_of(Leaky(), request)


# --- what an SDK user sees ------------------------------------------------------------------


def test_openai_tool_call_parses_with_arguments_and_usage(oai: openai.OpenAI) -> None:
    completion = ask_openai(oai, TOOL_SEED)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "lookup_order"
    assert json.loads(call.function.arguments) == {"order_id": "A-17", "verbose": True}
    asked = ChatRequest(
        provider="openai",
        model="gpt-sim",
        messages=(Message("user", PROMPT),),
        tools=("lookup_order",),
    )
    expected = estimate_usage(asked, TOOL_ACTION)
    assert completion.usage.prompt_tokens == expected.input_tokens
    assert completion.usage.completion_tokens == expected.output_tokens
    assert completion.usage.total_tokens == expected.input_tokens + expected.output_tokens

    # Hand the tool's result back: the policy then answers in text.
    follow_up = oai.chat.completions.create(
        model="gpt-sim",
        messages=[
            {"role": "user", "content": PROMPT},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped"}'},
        ],
        tools=OPENAI_TOOLS,
    )
    assert follow_up.choices[0].message.content == AFTER_TOOL.text
    assert follow_up.choices[0].finish_reason == "stop"


def test_openai_streaming_text_and_tool_calls(oai: openai.OpenAI) -> None:
    for seed, expected in ((TEXT_SEED, TEXT_ACTION), (TOOL_SEED, TOOL_ACTION)):
        with oai.chat.completions.stream(
            model="gpt-sim",
            messages=[{"role": "user", "content": PROMPT}],
            tools=OPENAI_TOOLS,
            stream_options={"include_usage": True},
            extra_headers=seeded(seed),
        ) as stream:
            final = stream.get_final_completion()
        assert openai_action(final) == expected
        assert final.usage is not None and final.usage.completion_tokens > 0


def test_anthropic_tool_use_round_trip(claude: anthropic.Anthropic) -> None:
    message = ask_anthropic(claude, TOOL_SEED)
    assert message.stop_reason == "tool_use"
    assert anthropic_action(message) == TOOL_ACTION
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    tool_use = next(b for b in message.content if b.type == "tool_use")

    follow_up = claude.messages.create(
        model="claude-sim",
        max_tokens=256,
        messages=[
            {"role": "user", "content": PROMPT},
            {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool_use.id, "content": "shipped"}
                ],
            },
        ],
        tools=ANTHROPIC_TOOLS,
    )
    assert anthropic_action(follow_up) == AFTER_TOOL
    assert follow_up.stop_reason == "end_turn"


def test_anthropic_streaming(claude: anthropic.Anthropic) -> None:
    for seed, expected in ((TEXT_SEED, TEXT_ACTION), (TOOL_SEED, TOOL_ACTION)):
        with claude.messages.stream(
            model="claude-sim",
            max_tokens=256,
            messages=[{"role": "user", "content": PROMPT}],
            tools=ANTHROPIC_TOOLS,
            extra_headers=seeded(seed),
        ) as stream:
            final = stream.get_final_message()
        assert anthropic_action(final) == expected
        assert final.usage.output_tokens > 0


def test_async_clients_stream_and_run_concurrently(sim: SimServer) -> None:
    async def scenario() -> None:
        async with anthropic.AsyncAnthropic(
            base_url=sim.anthropic_base_url, api_key="sk-test", max_retries=0
        ) as claude:
            message = await claude.messages.create(
                model="claude-sim",
                max_tokens=256,
                messages=[{"role": "user", "content": PROMPT}],
                extra_headers=seeded(TEXT_SEED),
            )
            assert anthropic_action(message) == TEXT_ACTION
            async with claude.messages.stream(
                model="claude-sim",
                max_tokens=256,
                messages=[{"role": "user", "content": PROMPT}],
                tools=ANTHROPIC_TOOLS,
                extra_headers=seeded(TOOL_SEED),
            ) as stream:
                assert anthropic_action(await stream.get_final_message()) == TOOL_ACTION

        async with openai.AsyncOpenAI(
            base_url=sim.openai_base_url, api_key="sk-test", max_retries=0
        ) as oai:
            seeds = range(32)
            completions = await asyncio.gather(
                *(
                    oai.chat.completions.create(
                        model="gpt-sim",
                        messages=[{"role": "user", "content": PROMPT}],
                        tools=OPENAI_TOOLS,
                        extra_headers=seeded(s),
                    )
                    for s in seeds
                )
            )
            for s, completion in zip(seeds, completions, strict=True):
                expected = TOOL_ACTION if uniform_for_seed(s) < P_TOOL else TEXT_ACTION
                assert openai_action(completion) == expected

    asyncio.run(scenario())


# --- seeds: common random numbers -----------------------------------------------------------


def test_the_same_seed_gives_the_same_action_and_id_across_providers(
    oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    for seed in (7, TOOL_SEED, TEXT_SEED):
        first, second = ask_openai(oai, seed), ask_openai(oai, seed)
        assert openai_action(first) == openai_action(second)
        assert first.id == second.id  # seeded ids are reproducible
        # The draw depends on the seed alone, so a fork that switches provider keeps its branch.
        assert anthropic_action(ask_anthropic(claude, seed)) == openai_action(first)


def test_seeds_sample_the_policy_frequencies(oai: openai.OpenAI) -> None:
    n = 200
    tool_calls = sum(bool(ask_openai(oai, seed).choices[0].message.tool_calls) for seed in range(n))
    # Binomial(n, P_TOOL): 4 standard deviations is a bound a correct sampler almost never crosses.
    tolerance = 4 * math.sqrt(n * P_TOOL * (1 - P_TOOL))
    assert abs(tool_calls - n * P_TOOL) <= tolerance
    assert 0 < tool_calls < n  # both branches are reached


# --- counters, errors, faults, latency --------------------------------------------------------


def test_counters_count_requests_by_provider(
    sim: SimServer, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    before = sim.app.stats()
    ask_openai(oai, 1)
    ask_openai(oai, 2)
    ask_anthropic(claude, 3)
    after = sim.app.stats()
    assert after["requests"] - before["requests"] == 3
    assert sim.requests_served - before["served"] == 3
    assert after["by_provider"]["openai"] - before["by_provider"]["openai"] == 2
    assert after["by_provider"]["anthropic"] - before["by_provider"]["anthropic"] == 1
    status, served_stats = http("GET", sim.url + "/_car_ray/stats")
    assert status == 200 and served_stats == after


def test_unknown_route_is_404_and_bad_bodies_are_400(sim: SimServer) -> None:
    status, body = http("POST", sim.url + "/v1/embeddings", b"{}")
    assert status == 404
    assert "/v1/embeddings" in body["error"]["message"]

    status, body = http("POST", sim.openai_base_url + "/chat/completions", b"{not json")
    assert status == 400
    assert "not JSON" in body["error"]["message"]

    status, body = http("POST", sim.anthropic_base_url + "/v1/messages", b'{"model": "m"}')
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "'messages' must be a list" in body["error"]["message"]


def test_a_broken_policy_is_a_500_naming_it() -> None:
    with (
        SimServer(Leaky()) as sim,
        openai.OpenAI(base_url=sim.openai_base_url, api_key="sk-test", max_retries=0) as oai,
        pytest.raises(openai.InternalServerError, match=r"Leaky: probabilities sum to 0\.9"),
    ):
        ask_openai(oai, 1)


def test_rate_limit_sends_retry_after_and_the_sdk_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the SDK decided to wait, read where it decides (not a wall-clock race: CI is loaded).
    waits: list[float] = []
    decide = anthropic.Anthropic._calculate_retry_timeout

    def spy(self: anthropic.Anthropic, *args: Any, **kwargs: Any) -> float:
        waits.append(decide(self, *args, **kwargs))
        return waits[-1]

    monkeypatch.setattr(anthropic.Anthropic, "_calculate_retry_timeout", spy)
    with SimServer(ToolOrAnswer(), rate_429=1.0, retry_after_s=0.02) as sim:
        with (
            openai.OpenAI(base_url=sim.openai_base_url, api_key="sk-test", max_retries=0) as oai,
            pytest.raises(openai.RateLimitError) as caught,
        ):
            ask_openai(oai, 1)
        headers = caught.value.response.headers
        assert headers["retry-after-ms"] == "20"
        assert headers["retry-after"] == "1"  # whole seconds, as the standard header must be
        assert sim.app.rate_limited == 1

        with (
            anthropic.Anthropic(
                base_url=sim.anthropic_base_url, api_key="sk-test", max_retries=1
            ) as claude,
            pytest.raises(anthropic.RateLimitError) as refused,
        ):
            ask_anthropic(claude, 1)
        # The SDK honoured retry-after-ms (20 ms), not its own backoff (0.375-0.5 s) or the 1 s
        # header, and retried once.
        assert waits == [pytest.approx(0.02)]
        assert refused.value.type == "rate_limit_error"
        assert sim.app.requests == 3 and sim.app.rate_limited == 3 and sim.app.served == 0


def test_faults_are_500_or_503() -> None:
    with (
        SimServer(ToolOrAnswer(), rate_5xx=1.0, fault_seed=3) as sim,
        openai.OpenAI(base_url=sim.openai_base_url, api_key="sk-test", max_retries=0) as oai,
    ):
        statuses = set()
        for seed in range(20):
            with pytest.raises(openai.InternalServerError) as caught:
                ask_openai(oai, seed)
            statuses.add(caught.value.status_code)
        assert statuses == {500, 503}
        assert sim.app.faults == 20 and sim.app.served == 0


def test_latency_is_applied() -> None:
    with (
        SimServer(ToolOrAnswer(), latency_s=0.15) as sim,
        openai.OpenAI(base_url=sim.openai_base_url, api_key="sk-test", max_retries=0) as oai,
    ):
        started = time.perf_counter()
        ask_openai(oai, 1)
        assert time.perf_counter() - started >= 0.15


def test_keep_alive_requests_do_not_stall(oai: openai.OpenAI) -> None:
    # Without TCP_NODELAY on the server, each reused connection's response body waited on the
    # client's delayed ACK: >= 40 ms a request. A healthy exchange takes a few milliseconds.
    seconds = []
    for seed in range(30):
        started = time.perf_counter()
        ask_openai(oai, seed)
        seconds.append(time.perf_counter() - started)
    assert sorted(seconds)[len(seconds) // 2] < 0.025


# --- out of process ---------------------------------------------------------------------------


def test_a_sim_process_serves_the_same_answers(
    oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    with (
        SimProcess("test_sim:ToolOrAnswer", search_path=(Path(__file__).parent,)) as child,
        openai.OpenAI(base_url=child.openai_base_url, api_key="sk-test", max_retries=0) as c_oai,
        anthropic.Anthropic(
            base_url=child.anthropic_base_url, api_key="sk-test", max_retries=0
        ) as c_claude,
    ):
        for seed in (TOOL_SEED, TEXT_SEED, 7):
            here, there = ask_openai(oai, seed), ask_openai(c_oai, seed)
            assert openai_action(there) == openai_action(here)
            assert there.id == here.id
            assert anthropic_action(ask_anthropic(c_claude, seed)) == anthropic_action(
                ask_anthropic(claude, seed)
            )
        assert child.requests_served == 6


def test_the_simulated_provider_starts_without_the_sdks_and_car_ray_names_still_resolve() -> None:
    # The sim's process imports car_ray.sim only: the openai and anthropic SDKs (~2 s of
    # imports) stay out of it, while every public name of car_ray loads on first use. The
    # CLI loads them only when an agent asks its context for a client (`car-ray jobs` and
    # the like start in under a second).
    code = (
        "import sys, car_ray.sim; assert 'openai' not in sys.modules, 'openai imported'; "
        "assert 'anthropic' not in sys.modules, 'anthropic imported'; "
        "import car_ray.cli; assert not {'openai', 'anthropic'} & set(sys.modules), 'by cli'; "
        "import car_ray; [getattr(car_ray, n) for n in car_ray.__all__]; "
        "from car_ray import *; print(AgentContext.__name__, recording.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["AgentContext", "recording"]
