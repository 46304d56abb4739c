"""The simulated model of the wrong-day booking, with exact probabilities.

Every step is a point mass except step 2, which holds a flight:
[(`P_CHEAP_WRONG_DAY` = 0.3, FR8431 on the 15th), (0.7, TP540 on the 14th)]. The bag, seat,
confirmation and summary steps (4, 6, 8, 10) just carry the held flight forward, so the
failure is committed at step 2 and only shows at step 9/10, seven steps later. Re-drawn, step
2 avoids it with probability 0.7; no other step can change the outcome."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall

from .agent import TRAVEL_DATE

P_CHEAP_WRONG_DAY = 0.3
WRONG_DAY_FLIGHT = "FR8431"
RIGHT_FLIGHT = "TP540"


def _call(name: str, **arguments: Any) -> Action:
    return Action(tool_calls=(ToolCall(name, arguments),))


class BookingPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        called = [c.name for m in request.messages for c in m.tool_calls]
        results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
        if not called:
            search = {"origin": "LIS", "destination": "BER", "date": TRAVEL_DATE}
            return [(1.0, _call("search_flights", **search))]
        if "hold_seat" not in called:
            return [
                (P_CHEAP_WRONG_DAY, _call("hold_seat", flight=WRONG_DAY_FLIGHT)),
                (1 - P_CHEAP_WRONG_DAY, _call("hold_seat", flight=RIGHT_FLIGHT)),
            ]
        hold_id = results[called.index("hold_seat")]["hold_id"]
        if "add_bag" not in called:
            return [(1.0, _call("add_bag", hold_id=hold_id, bags=1))]
        if "choose_seat" not in called:
            return [(1.0, _call("choose_seat", hold_id=hold_id, preference="aisle"))]
        if "confirm_booking" not in called:
            return [(1.0, _call("confirm_booking", hold_id=hold_id))]
        booked = results[-1]
        summary = (
            f"Booked {booked['flight']} on {booked['date']}, departing {booked['departs']} and "
            f"landing {booked['arrives']}, with one bag and an aisle seat. "
            f"Reference {booked['booking']}."
        )
        return [(1.0, Action(text=summary))]


POLICY = BookingPolicy()
SCENARIO = {
    "kind": "late_commit",
    "planted": {"resample": [2], "observation": [], "policy": []},
    "description": (
        "Holding the cheap next-day flight at step 2 commits a wrong-day booking that only "
        "shows when the itinerary is confirmed seven steps later."
    ),
}
