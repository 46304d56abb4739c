"""The OpenAI Agents SDK under car-ray: `run(ctx, agent, input)` (`await run_async(...)`,
`run_streamed(...)`) runs an `agents.Agent` with its model calls on the run's client (the
SDK's default, the Responses API), tracing off (nothing leaves the run), and its function
tools recorded as steps (`effects`: the names of tools with side effects, which only run
while recording). Handoff agents are run the same way."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Collection
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    Handoff,
    OpenAIProvider,
    RunConfig,
    Runner,
    RunResult,
    RunResultStreaming,
)

from ..replay import AgentContext, current_context


def run_config(ctx: AgentContext, **settings: Any) -> RunConfig:
    """A `RunConfig` whose model provider is the run's OpenAI client, tracing off."""
    provider = OpenAIProvider(openai_client=ctx.async_openai(), use_responses=True)
    return RunConfig(model_provider=provider, tracing_disabled=True, **settings)


def recorded(agent: Agent[Any], effects: Collection[str] = ()) -> Agent[Any]:
    """A copy of `agent` (and of the agents it hands off to) whose function tools are
    recorded as steps of the current run; `effects` names those with side effects."""
    seen: dict[int, Agent[Any]] = {}

    def copy(agent: Agent[Any]) -> Agent[Any]:
        if id(agent) in seen:
            return seen[id(agent)]
        clone = agent.clone()
        seen[id(agent)] = clone
        tools = [
            _recorded_tool(t, t.name in effects) if isinstance(t, FunctionTool) else t
            for t in agent.tools
        ]
        handoffs = [
            copy(h) if isinstance(h, Agent) else _recorded_handoff(h, copy) for h in agent.handoffs
        ]
        object.__setattr__(clone, "tools", tools)
        object.__setattr__(clone, "handoffs", handoffs)
        return clone

    return copy(agent)


def _recorded_handoff(
    handoff: Handoff[Any, Any], copy: Callable[[Agent[Any]], Agent[Any]]
) -> Handoff[Any, Any]:
    """A `handoff(agent, ...)`: the agent it hands off to, recorded as well."""
    original = handoff.on_invoke_handoff

    async def invoke(context: Any, arguments: str) -> Any:
        target = await original(context, arguments)
        return copy(target) if isinstance(target, Agent) else target

    return dataclasses.replace(handoff, on_invoke_handoff=invoke)


def _recorded_tool(tool: FunctionTool, effect: bool) -> FunctionTool:
    original = tool.on_invoke_tool

    async def invoke(tool_context: Any, arguments: str) -> Any:
        ctx = current_context()
        if ctx is None:
            return await original(tool_context, arguments)

        async def call(**kwargs: Any) -> Any:
            return await original(tool_context, json.dumps(kwargs))

        return await ctx.tool(tool.name, call, effect=effect, **json.loads(arguments or "{}"))

    return dataclasses.replace(tool, on_invoke_tool=invoke)


def run(
    ctx: AgentContext,
    agent: Agent[Any],
    input: Any,
    *,
    effects: Collection[str] = (),
    **kwargs: Any,
) -> RunResult:
    """`Runner.run_sync(agent, input)` under car-ray (a sync agent function)."""
    return Runner.run_sync(recorded(agent, effects), input, run_config=run_config(ctx), **kwargs)


def run_streamed(
    ctx: AgentContext,
    agent: Agent[Any],
    input: Any,
    *,
    effects: Collection[str] = (),
    **kwargs: Any,
) -> RunResultStreaming:
    """`Runner.run_streamed(agent, input)` under car-ray (an async agent function iterates
    its `stream_events()`); the model's answers stream as `response.*` events."""
    return Runner.run_streamed(
        recorded(agent, effects), input, run_config=run_config(ctx), **kwargs
    )


async def run_async(
    ctx: AgentContext,
    agent: Agent[Any],
    input: Any,
    *,
    effects: Collection[str] = (),
    **kwargs: Any,
) -> RunResult:
    """`await Runner.run(agent, input)` under car-ray (an async agent function)."""
    return await Runner.run(recorded(agent, effects), input, run_config=run_config(ctx), **kwargs)
