"""The simulated model of tests/scenarios/coupling, with exact chances.

Step 0 plans A or B (0.5 each). Step 1 decides: after A, [(0.4, Deny), (0.6, Refund)]; after
B, [(0.3, Refund), (0.35, Deny), (0.35, Escalate)] (Refund listed first: the recorded draw's
uniform, above 0.4, lands on another decision than a maximal coupling would keep). Step 2
closes (a point mass) unless step 1 escalated; then a supervisor refunds or denies (0.5 each).
The recorded run plans A, refunds and closes."""

from __future__ import annotations

from collections.abc import Sequence

from car_ray.providers import Action, ChatRequest

PLAN_A = 0.5
AFTER_A = (("Deny.", 0.4), ("Refund.", 0.6))
AFTER_B = (("Refund.", 0.3), ("Deny.", 0.35), ("Escalate.", 0.35))
SUPERVISOR = (("Refund.", 0.5), ("Deny.", 0.5))


def _actions(options: Sequence[tuple[str, float]]) -> list[tuple[float, Action]]:
    return [(p, Action(text=text)) for text, p in options]


class CouplingPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        said = [m.content for m in request.messages if m.role == "assistant"]
        if not said:
            return _actions((("Plan A.", PLAN_A), ("Plan B.", 1 - PLAN_A)))
        if len(said) == 1:
            return _actions(AFTER_A if said[0] == "Plan A." else AFTER_B)
        if said[1] == "Escalate.":
            return _actions(SUPERVISOR)
        return _actions((("Closed.", 1.0),))


POLICY = CouplingPolicy()
