"""An MCP server over stdio with the weather tool (tests/test_frameworks.py spawns it)."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("weather")


@server.tool()
def get_weather(city: str) -> dict[str, Any]:
    """Tomorrow's weather in a city."""
    return {"city": city, "forecast": "rain", "celsius": 11}


if __name__ == "__main__":
    server.run()
