"""The simulated model of the duplicate-orders ETL, with exact probabilities.

Step 0 inspects the export [(`P_HEAD` = 0.5, mode head), (0.5, mode stats)]: either way the
rest of the run is unchanged (no later distribution reads it), so its Shapley value is 0.
Step 2 (A) transforms [(`P_SKIP_DEDUPE` = 0.3, dedupe false), (0.7, dedupe true)] and step 4
(B) loads [(`P_LOAD_PROD` = 0.3, into prod.orders), (0.7, into staging.orders)], each the same
in every context (B's batch id follows A's result, B's choice does not). Step 6 is a point
mass. The failure needs A and B both: in the flip game v(S) = P(good | S re-drawn),
v(A) = 0.7, v(B) = 0.7, v(A, B) = 1 - 0.3 * 0.3 = 0.91, so phi(A) = phi(B) = (0.7 + 0.21) / 2
= 0.455 and phi(0) = phi(6) = 0."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall

from .agent import EXPORT

P_HEAD = 0.5
P_SKIP_DEDUPE = 0.3
P_LOAD_PROD = 0.3


def _call(name: str, **arguments: Any) -> Action:
    return Action(tool_calls=(ToolCall(name, arguments),))


class EtlPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        called = [c.name for m in request.messages for c in m.tool_calls]
        results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
        if not called:
            return [
                (P_HEAD, _call("inspect_export", path=EXPORT, mode="head")),
                (1 - P_HEAD, _call("inspect_export", path=EXPORT, mode="stats")),
            ]
        if "transform" not in called:
            return [
                (P_SKIP_DEDUPE, _call("transform", path=EXPORT, dedupe=False)),
                (1 - P_SKIP_DEDUPE, _call("transform", path=EXPORT, dedupe=True)),
            ]
        if "load_batch" not in called:
            batch = results[-1]["batch_id"]
            return [
                (P_LOAD_PROD, _call("load_batch", batch_id=batch, target="prod.orders")),
                (1 - P_LOAD_PROD, _call("load_batch", batch_id=batch, target="staging.orders")),
            ]
        load = results[-1]
        summary = (
            f"Loaded the batch into {load['target']}; duplicate rows now in prod.orders: "
            f"{load['prod_duplicates']}."
        )
        return [(1.0, Action(text=summary))]


POLICY = EtlPolicy()
SCENARIO = {
    "kind": "and_conj",
    "planted": {"resample": [2, 4], "observation": [], "policy": []},
    "description": (
        "Duplicates reach prod.orders only because the agent both skipped de-duplication "
        "(step 2) and loaded straight into prod (step 4)."
    ),
}
