"""The weather agent of tests/matrix_agents.py built on each framework, with one line of
car-ray in each (test fixtures for tests/test_frameworks.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import car_ray
from tests import matrix_agents

QUESTION = "Weather in Oslo?"


@car_ray.tool
def get_weather(city: str) -> dict[str, Any]:
    """Tomorrow's weather in a city."""
    return matrix_agents.get_weather(city)


# -- the OpenAI Agents SDK ------------------------------------------------------------------------


def _agents_sdk_agent() -> Any:
    from agents import Agent, function_tool

    @function_tool
    def get_weather(city: str) -> dict[str, Any]:
        """Tomorrow's weather in a city."""
        return matrix_agents.get_weather(city)

    return Agent(
        name="weather",
        instructions=matrix_agents.SYSTEM,
        tools=[get_weather],
        model="gpt-4o-mini",
    )


def agents_sdk(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from car_ray.integrations import openai_agents

    effects = ctx.input.get("effects", ())
    result = openai_agents.run(ctx, _agents_sdk_agent(), QUESTION, effects=effects)
    return {"answer": result.final_output}


async def agents_sdk_async(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from car_ray.integrations import openai_agents

    result = await openai_agents.run_async(ctx, _agents_sdk_agent(), QUESTION)
    return {"answer": result.final_output}


async def agents_sdk_streamed(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from car_ray.integrations import openai_agents

    result = openai_agents.run_streamed(ctx, _agents_sdk_agent(), QUESTION)
    async for _event in result.stream_events():
        pass
    return {"answer": result.final_output}


# -- LangGraph ------------------------------------------------------------------------------------


def langgraph(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    from car_ray.integrations.langchain import chat_openai

    graph = create_react_agent(chat_openai(ctx), [tool(get_weather)], prompt=matrix_agents.SYSTEM)
    state = graph.invoke({"messages": [("user", QUESTION)]})
    return {"answer": state["messages"][-1].content}


async def langgraph_async(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from langchain_core.tools import tool
    from langgraph.prebuilt import create_react_agent

    from car_ray.integrations.langchain import chat_openai

    graph = create_react_agent(chat_openai(ctx), [tool(get_weather)], prompt=matrix_agents.SYSTEM)
    state = await graph.ainvoke({"messages": [("user", QUESTION)]})
    return {"answer": state["messages"][-1].content}


def langchain_anthropic(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool

    from car_ray.integrations.langchain import chat_anthropic

    weather = tool(get_weather)
    model = chat_anthropic(ctx, max_tokens=256).bind_tools([weather])
    messages: list[Any] = [SystemMessage(matrix_agents.SYSTEM), HumanMessage(QUESTION)]
    reply = model.invoke(messages)
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(
            ToolMessage(json.dumps(weather.invoke(call["args"])), tool_call_id=call["id"])
        )
    return {"answer": model.invoke(messages).content}


# -- pydantic-ai ----------------------------------------------------------------------------------


def pydantic_ai(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from pydantic_ai import Agent

    from car_ray.integrations.pydantic_ai import openai_model

    agent = Agent(openai_model(ctx), instructions=matrix_agents.SYSTEM, tools=[get_weather])
    return {"answer": agent.run_sync(QUESTION).output}


async def pydantic_ai_responses(ctx: car_ray.AgentContext) -> dict[str, Any]:
    from pydantic_ai import Agent

    from car_ray.integrations.pydantic_ai import openai_responses_model

    agent = Agent(
        openai_responses_model(ctx), instructions=matrix_agents.SYSTEM, tools=[get_weather]
    )
    return {"answer": (await agent.run(QUESTION)).output}


# -- MCP ------------------------------------------------------------------------------------------

SERVER = Path(__file__).with_name("mcp_weather_server.py")


async def mcp_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    """Chat completions with the tools an MCP server (stdio) lists, called through its
    session."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from car_ray.integrations.mcp import recorded

    params = StdioServerParameters(command=sys.executable, args=[str(SERVER)])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as raw:
        await raw.initialize()
        session = recorded(raw, effects=ctx.input.get("effects", ()))
        listed = await session.list_tools()
        tools = [
            {
                "type": "function",
                "function": {"name": t.name, "parameters": t.input_schema},
            }
            for t in listed.tools
        ]
        client = ctx.async_openai()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": matrix_agents.SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        reply = (
            (
                await client.chat.completions.create(
                    model="gpt-4o-mini", messages=messages, tools=tools
                )
            )
            .choices[0]
            .message
        )
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls or []:
            result = await session.call_tool(
                call.function.name, json.loads(call.function.arguments)
            )
            text = "".join(getattr(part, "text", "") for part in result.content)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
        final = (
            (
                await client.chat.completions.create(
                    model="gpt-4o-mini", messages=messages, tools=tools
                )
            )
            .choices[0]
            .message
        )
        return {"answer": final.content}


AGENTS = {
    "agents_sdk": agents_sdk,
    "agents_sdk_async": agents_sdk_async,
    "agents_sdk_streamed": agents_sdk_streamed,
    "langgraph": langgraph,
    "langgraph_async": langgraph_async,
    "langchain_anthropic": langchain_anthropic,
    "pydantic_ai": pydantic_ai,
    "pydantic_ai_responses": pydantic_ai_responses,
    "mcp": mcp_agent,
}
