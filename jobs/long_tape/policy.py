"""The simulated model of the 30-item repricing, with exact probabilities.

Step 0 fetches the catalog [(`P_PAGE_50` = 0.5, page size 50), (0.5, page size 100)]: the
catalog has 30 items, so both pages are the same and no later distribution reads the page
size (phi 0). Step 2 sets the markup [(`P_FACTOR_MISREAD` = 0.2, factor 0.10), (0.8, factor
1.10)]. Every later step (4, 6, ..., 62: stage item i at round(price * factor, 2); 64: the
summary) is a point mass that just applies the rule. Re-drawn, step 2 fixes the run with
probability 0.8; no other step can change it, so in the flip game phi(2) = 0.8 and every
other phi is 0."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall

P_PAGE_50 = 0.5
P_FACTOR_MISREAD = 0.2
MISREAD_FACTOR = 0.10
MARKUP_FACTOR = 1.10


def _call(name: str, **arguments: Any) -> Action:
    return Action(tool_calls=(ToolCall(name, arguments),))


class PricingPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        called = [c.name for m in request.messages for c in m.tool_calls]
        results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
        if not called:
            return [
                (P_PAGE_50, _call("get_catalog", season="spring", page_size=50)),
                (1 - P_PAGE_50, _call("get_catalog", season="spring", page_size=100)),
            ]
        if "set_markup" not in called:
            return [
                (P_FACTOR_MISREAD, _call("set_markup", factor=MISREAD_FACTOR)),
                (1 - P_FACTOR_MISREAD, _call("set_markup", factor=MARKUP_FACTOR)),
            ]
        items = results[0]["items"]
        factor = results[1]["factor"]
        done = called.count("update_price")
        if done < len(items):
            item = items[done]
            price = round(item["price"] * factor, 2)
            return [(1.0, _call("update_price", sku=item["sku"], price=price))]
        summary = f"Staged {done} new prices with markup rule {results[1]['rule_id']}."
        return [(1.0, Action(text=summary))]


POLICY = PricingPolicy()
SCENARIO = {
    "kind": "long_tape",
    "planted": {"resample": [2], "observation": [], "policy": []},
    "description": (
        "A markup factor of 0.10 set at step 2 is applied to 30 items over the next 60 "
        "steps, and the below-cost prices only show in the final staged list."
    ),
}
