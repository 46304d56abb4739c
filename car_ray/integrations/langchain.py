"""LangChain and LangGraph under car-ray: `chat_openai(ctx, ...)` and `chat_anthropic(ctx,
...)` are `ChatOpenAI` / `ChatAnthropic` whose every call is a step of the run (the run's
base URL, key and transport; the SDKs' retries off, as car-ray retries itself). Any other
keyword goes to the model's constructor. Tools: define them with `@car_ray.tool` under
LangChain's `@tool` (LangGraph's `ToolNode` and `create_react_agent` call them in the run's
context, so each call is recorded)."""

from __future__ import annotations

from typing import Any

from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI

from ..replay import AgentContext


def chat_openai(ctx: AgentContext, model: str = "gpt-4o-mini", **kwargs: Any) -> ChatOpenAI:
    """`ChatOpenAI` bound to the run (chat completions, or the Responses API with
    `use_responses_api=True`)."""
    return ChatOpenAI(
        model=model,
        base_url=ctx.base_url("openai"),
        api_key=ctx.api_key("openai"),
        http_client=ctx.http_client,
        http_async_client=ctx.async_http_client,
        max_retries=0,
        **kwargs,
    )


def chat_anthropic(
    ctx: AgentContext, model: str = "claude-haiku-4-5", **kwargs: Any
) -> ChatAnthropic:
    """`ChatAnthropic` bound to the run: its clients are the run's (`ctx.anthropic()`,
    `ctx.async_anthropic()`), which LangChain would otherwise build itself."""
    chat = ChatAnthropic(
        model=model,
        base_url=ctx.base_url("anthropic"),
        api_key=ctx.api_key("anthropic"),
        max_retries=0,
        **kwargs,
    )
    # Its clients are cached properties: set, they are never built.
    chat.__dict__["_client"] = ctx.anthropic()
    chat.__dict__["_async_client"] = ctx.async_anthropic()
    return chat
