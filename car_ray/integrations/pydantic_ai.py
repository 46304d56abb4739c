"""pydantic-ai under car-ray: `openai_model(ctx, name)` (chat completions),
`openai_responses_model(ctx, name)` (the Responses API) and `anthropic_model(ctx, name)`
are models whose every call is a step of the run; pass one as `Agent(model=...)` or to
`agent.run(..., model=...)`. Tools: define them with `@car_ray.tool` under the agent's
`@agent.tool_plain` (or wrap a `RunContext` tool's body in a `@car_ray.tool` function)."""

from __future__ import annotations

from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

from ..replay import AgentContext


def openai_model(ctx: AgentContext, name: str = "gpt-4o-mini") -> OpenAIChatModel:
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=ctx.async_openai()))


def openai_responses_model(ctx: AgentContext, name: str = "gpt-4o-mini") -> OpenAIResponsesModel:
    return OpenAIResponsesModel(name, provider=OpenAIProvider(openai_client=ctx.async_openai()))


def anthropic_model(ctx: AgentContext, name: str = "claude-haiku-4-5") -> AnthropicModel:
    provider = AnthropicProvider(anthropic_client=ctx.async_anthropic())
    return AnthropicModel(name, provider=provider)
