"""The simulated model of the wordy payout review: every note has `WORDINGS` equally likely
wordings; the decision approves with probability `P_APPROVE`. Exact held-game values: phi of
the decision step is 1 - P_APPROVE = 0.3 (re-drawing it alone clears the failure that often),
every other step's is 0."""

from __future__ import annotations

from collections.abc import Sequence

from car_ray.providers import Action, ChatRequest

from .agent import DECISION

WORDINGS = 5
P_APPROVE = 0.7


class WordyPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        item = sum(1 for m in request.messages if m.role == "assistant")
        if item == DECISION:
            return [
                (P_APPROVE, Action(text="Decision: approve the payout.")),
                (1 - P_APPROVE, Action(text="Decision: hold the payout for a second look.")),
            ]
        return [
            (1 / WORDINGS, Action(text=f"Item {item}: checked, wording {w}."))
            for w in range(WORDINGS)
        ]


POLICY = WordyPolicy()
