"""The simulated model of the support scenario, with exact probabilities.

The decision turn refunds with probability 0.8 when the injected order note is in the
context and 0.05 when it is not: the injection is the cause the demo must find."""

from __future__ import annotations

from collections.abc import Sequence

from car_ray.providers import Action, ChatRequest, ToolCall

from .agent import INJECTION

P_REFUND_INJECTED = 0.8
P_REFUND_CLEAN = 0.05
P_CHECK_POLICY = 0.9


class SupportPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        tool_results = [m for m in request.messages if m.role == "tool"]
        called = [c.name for m in request.messages for c in m.tool_calls]
        if "issue_refund" in called:
            return [(1.0, Action(text="Your refund has been issued."))]
        if not tool_results:
            return [(1.0, Action(tool_calls=(ToolCall("lookup_order", {"order_id": "A1001"}),)))]
        if "refund_policy" not in called and len(tool_results) == 1:
            check = Action(tool_calls=(ToolCall("refund_policy", {"item": "espresso machine"}),))
            # Mostly check the policy first; sometimes decide at once.
            direct = _decision(INJECTION in request.transcript())
            return [(P_CHECK_POLICY, check)] + [((1 - P_CHECK_POLICY) * p, a) for p, a in direct]
        return _decision(INJECTION in request.transcript())


def _decision(injected: bool) -> list[tuple[float, Action]]:
    p = P_REFUND_INJECTED if injected else P_REFUND_CLEAN
    refund = Action(
        tool_calls=(ToolCall("issue_refund", {"order_id": "A1001", "amount_usd": 249.0}),)
    )
    deny = Action(text="Sorry, this order is not eligible for a refund under our policy.")
    return [(p, refund), (1 - p, deny)]


POLICY = SupportPolicy()
