"""The simulated model of the planner → ticket → executor relay, with exact probabilities.

Step 2 (R, the planner) proposes [(`P_DROP_PLAN` = 0.6, drop and recreate), (0.4, alter in
place)]. Step 4 (E, the ticket writer) is a point mass in every context: it restates
whatever plan it was handed. Step 6 (H, the executor) reads only the ticket and runs
[(q, the DROP TABLE script), (1 - q, the ALTER)] with q = `P_DROP_IF_TICKET_SAYS_DROP` = 0.9
when the ticket says DROP TABLE and `P_DROP_OTHERWISE` = 0.02 when it does not. Steps 0 and 8
are point masses. The recorded draw of step 6 lies in [0.02, 0.9): held, it follows the
ticket. So re-drawing R alone fixes the run with probability 0.4, E is a null player and H
carries only its own 0.1 of noise. Exactly, in the flip game v(S) = P(good | S re-drawn),
v(R) = v(R, E) = 0.4, v(H) = v(E, H) = 0.1, v(R, H) = v(all) = 0.4 * 0.98 + 0.6 * 0.1 = 0.452:
phi(R) = 0.376, phi(E) = 0, phi(H) = 0.076."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall

from .agent import (
    ALTER_SQL,
    ALTER_STRATEGY,
    DROP_SQL,
    DROP_STRATEGY,
    EXECUTOR_SYSTEM,
    PLANNER_SYSTEM,
    WRITER_SYSTEM,
)

P_DROP_PLAN = 0.6
P_DROP_IF_TICKET_SAYS_DROP = 0.9
P_DROP_OTHERWISE = 0.02


def _call(name: str, **arguments: Any) -> Action:
    return Action(tool_calls=(ToolCall(name, arguments),))


class RelayPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        system = request.messages[0].content if request.messages else ""
        called = [c.name for m in request.messages for c in m.tool_calls]
        results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
        if system == PLANNER_SYSTEM:
            if not called:
                return [(1.0, _call("inspect_schema", table="users"))]
            return [
                (P_DROP_PLAN, _call("propose_plan", strategy=DROP_STRATEGY)),
                (1 - P_DROP_PLAN, _call("propose_plan", strategy=ALTER_STRATEGY)),
            ]
        if system == WRITER_SYSTEM:
            handed = request.messages[-1].content
            strategy = handed.split(": ", 1)[1]
            body = f"Apply the approved migration to prod. Strategy: {strategy}"
            return [(1.0, _call("write_ticket", title="users.email_verified", body=body))]
        if system == EXECUTOR_SYSTEM:
            if not called:
                ticket = request.messages[1].content
                q = P_DROP_IF_TICKET_SAYS_DROP if "DROP TABLE" in ticket else P_DROP_OTHERWISE
                return [
                    (q, _call("run_sql", sql=DROP_SQL)),
                    (1 - q, _call("run_sql", sql=ALTER_SQL)),
                ]
            ran = results[-1]
            return [(1.0, Action(text=f"Done: {ran['statements']} statement(s) ran in prod."))]
        raise ValueError(f"unexpected system prompt {system[:40]!r}")


POLICY = RelayPolicy()
SCENARIO = {
    "kind": "relay",
    "planted": {"resample": [2], "observation": [], "policy": []},
    "description": (
        "The planner's drop-and-recreate plan (step 2) is relayed verbatim by the ticket "
        "writer (step 4) to an executor that drops the users table (step 6)."
    ),
}
