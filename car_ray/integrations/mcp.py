"""MCP tools under car-ray: `recorded(session)` wraps an MCP `ClientSession` so that every
`call_tool` inside a car-ray run is a tool step: recorded with its name and arguments,
served from the tape on replay and in a fork that makes the same call, and, for a tool named
in `effects`, never run outside a recording (a fork that calls it otherwise stops there).
Everything else goes to the session."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from mcp import ClientSession
from mcp.types import CallToolResult

from ..replay import current_context


class RecordedSession:
    """An MCP client session whose tool calls are steps of the current run."""

    def __init__(self, session: ClientSession, effects: Collection[str] = ()) -> None:
        self._session = session
        self._effects = frozenset(effects)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, *args: Any, **kwargs: Any
    ) -> CallToolResult:
        ctx = current_context()
        if ctx is None:
            result: CallToolResult = await self._session.call_tool(name, arguments, *args, **kwargs)
            return result

        async def call(**given: Any) -> dict[str, Any]:
            answer = await self._session.call_tool(name, given, *args, **kwargs)
            # The tape holds JSON: the result as the protocol sends it.
            data: dict[str, Any] = answer.model_dump(mode="json", by_alias=True, exclude_none=True)
            return data

        effect = name in self._effects
        data = await ctx.tool(name, call, effect=effect, **(arguments or {}))
        return CallToolResult.model_validate(data)


def recorded(session: ClientSession, effects: Collection[str] = ()) -> RecordedSession:
    """`session`, its tool calls recorded as steps; `effects` names tools with side effects."""
    return RecordedSession(session, effects)
