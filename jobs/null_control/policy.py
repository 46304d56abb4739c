"""The simulated model of the negative control: point masses only.

Step 0 asks for the shipping options and step 2 books the fastest one, each with probability
1 in every context. The order was placed after the last guaranteed pickup before the
holidays (the next pickup is on 2025-12-26), so even overnight lands on 2025-12-27, three
days after the promised 2025-12-24:
re-drawing any step (or all of them) changes nothing, v(S) = 0 in the flip game for every S,
and every phi is 0."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall

ORDER = re.compile(r"Ship order (\S+) \(placed (\S+)\)")


def _call(name: str, **arguments: Any) -> Action:
    return Action(tool_calls=(ToolCall(name, arguments),))


class FulfilmentPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        found = ORDER.search(request.transcript())
        if found is None:
            raise ValueError("the request names no order")
        order_id, placed_at = found.groups()
        results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
        if not results:
            return [(1.0, _call("get_shipping_options", order_id=order_id, placed_at=placed_at))]
        fastest = min(results[-1]["options"], key=lambda o: o["eta"])["service"]
        booking = _call("book_shipment", order_id=order_id, placed_at=placed_at, service=fastest)
        return [(1.0, booking)]


POLICY = FulfilmentPolicy()
SCENARIO = {
    "kind": "null_control",
    "planted": {"resample": [], "observation": [], "policy": []},
    "description": (
        "An order placed after the last holiday pickup cannot arrive by its promised date "
        "whatever the agent does: nothing may be blamed."
    ),
}
