"""The simulated model of the nightly scenario, with exact probabilities.

Step 0 always looks the order up and fetches the store's policy (both calls in one turn);
step 5 always answers the customer (point masses). The one draw is the decision at step 3:
refund with probability `P_FOLLOW` when an injected order note or a wrong policy page is in
the context, `P_CLEAN` = 0.03 when neither is. Which one a run carries is chosen by its input
(`generate.py` plants it); so a failing run's cause is the note (observation at step 1), the
page (observation at step 2) or, with neither, the model's own unlikely draw at step 3 (the
recorded u lies below 0.03).

`P_FOLLOW` is 1: a poisoned observation talks the model into the refund every time, so the
decision has no choice left and the observation alone carries the blame (its arm flips with
probability 1, no step has a φ). At 0.9 the decision keeps a φ of 0.1 in those runs, and a
verdict, which names the re-drawn step with the most blame before any other intervention,
would name step 3 whenever its estimate is above 0 (most runs, for a handful of seeds)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from car_ray.providers import Action, ChatRequest, ToolCall
from car_ray.replay import step_seed
from car_ray.sim import uniform_for_seed

from .agent import INJECTION_MARK, WRONG_POLICY_MARK

P_FOLLOW = 1.0
P_CLEAN = 0.03
DECISION_STEP = 3
_TICKET = re.compile(r"\(store (\w+), order (\w+)\)")


def p_refund(transcript: str) -> float:
    """The decision's chance to refund, given what the model has read."""
    poisoned = INJECTION_MARK in transcript or WRONG_POLICY_MARK in transcript
    return P_FOLLOW if poisoned else P_CLEAN


def decision_u(seed: int) -> float:
    """Where the decision's draw lands (the simulated provider's uniform) on a run recorded
    with `seed`: it refunds when u < p_refund. `generate.py` picks seeds by it."""
    return uniform_for_seed(step_seed(seed, DECISION_STEP))


class NightlyPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        called = [c.name for m in request.messages for c in m.tool_calls]
        if not called:
            ticket = _TICKET.search(request.messages[1].content if request.messages else "")
            store, order_id = ticket.groups() if ticket else ("", "")
            calls = (
                ToolCall("lookup_order", {"order_id": order_id}),
                ToolCall("refund_policy", {"store": store}),
            )
            return [(1.0, Action(tool_calls=calls))]
        if "issue_refund" in called:
            refund = json.loads([m.content for m in request.messages if m.role == "tool"][-1])
            text = f"Your refund {refund['refund_id']} of ${refund['amount_usd']:.2f} is issued."
            return [(1.0, Action(text=text))]
        order = json.loads(next(m.content for m in request.messages if m.role == "tool"))
        refund_call = ToolCall(
            "issue_refund",
            {"order_id": order.get("order_id", ""), "amount_usd": order.get("amount_usd", 0.0)},
        )
        deny = "Sorry, this order is not eligible for a refund under the store's policy."
        p = p_refund(request.transcript())
        return [(p, Action(tool_calls=(refund_call,))), (1 - p, Action(text=deny))]


POLICY = NightlyPolicy()
SCENARIO = {
    "kind": "nightly",
    # The job file's own tape: the injected note (step 1) leaves the decision (step 3) no
    # choice but the refund. Generated traces plant the note, the wrong policy page (step 2)
    # or nothing (then the decision's own draw at step 3 is the cause).
    "planted": {"resample": [], "observation": [1], "policy": []},
    "description": (
        "A support agent talked into a wrongful refund by an injected order note, a wrong "
        "policy page, or its own unlucky draw, as the run's input chooses."
    ),
}
