"""jobs/support_refund's agent on the OpenAI Responses API: the same tools, the same model
behind it (the scenario's policy reads the same conversation), the conversation kept by the
provider (`previous_response_id`) instead of resent: the sync SDK without streaming
(tests/matrix_agents.py has the async and streaming ways)."""

from __future__ import annotations

import json
from typing import Any

from support_refund.agent import (
    MODEL,
    SYSTEM,
    TOOL_FUNCTIONS,
    issue_refund,
)
from support_refund.agent import (
    TOOLS as CHAT_TOOLS,
)

import car_ray

# The Responses API's function tools are flat: {"type", "name", "description", "parameters"}.
TOOLS = [{"type": "function", **tool["function"]} for tool in CHAT_TOOLS]


def _run_tool(ctx: car_ray.AgentContext, name: str, arguments: dict[str, Any]) -> Any:
    if name == "issue_refund":
        return ctx.tool("issue_refund", issue_refund, effect=True, **arguments)
    return ctx.tool(name, TOOL_FUNCTIONS[name], **arguments)


def support_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.openai()
    ticket = ctx.input
    received = ctx.now()
    refunded: dict[str, Any] | None = None
    turn: Any = f"Ticket {ticket['ticket_id']}: {ticket['text']}"
    previous: str | None = None
    for _turn in range(6):
        response = client.responses.create(
            model=MODEL,
            instructions=SYSTEM,
            input=turn,
            tools=TOOLS,  # type: ignore[arg-type]
            **({"previous_response_id": previous} if previous else {}),
        )
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return {"reply": response.output_text, "refund": refunded, "received_at": received}
        previous, turn = response.id, []
        for call in calls:
            result = _run_tool(ctx, call.name, json.loads(call.arguments))
            if call.name == "issue_refund":
                refunded = result
            turn.append(
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": json.dumps(result),
                }
            )
    return {"reply": None, "refund": refunded, "received_at": received}
