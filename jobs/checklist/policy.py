"""The simulated model of the checklist review (`Checklist`), with exact probabilities.

Item i's model call (step 2i) calls check_item(item=i, verdict="ok"), except at the planted
items, where it waives the item with that item's probability. The closing summary states the
number waived, and the scorer counts the run bad when the waived items reach the input's
threshold. Sparse: one or two planted items, threshold 1; dense: many planted items, each
waived with some probability, threshold 2 (each waived item shares the blame with the others
waived beside it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall


def _check(item: int, verdict: str) -> Action:
    return Action(tool_calls=(ToolCall("check_item", {"item": item, "verdict": verdict}),))


class Checklist:
    """`items` items; `planted` maps an item to the probability its call waives it."""

    def __init__(self, items: int, planted: Mapping[int, float]) -> None:
        self.items = items
        self.planted = dict(planted)

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        done = [
            json.loads(m.content)
            for m in request.messages
            if m.role == "tool" and m.content.startswith("{")
        ]
        item = len(done)
        if item < self.items:
            p = self.planted.get(item)
            if p is None:
                return [(1.0, _check(item, "ok"))]
            return [(p, _check(item, "waived")), (1.0 - p, _check(item, "ok"))]
        waived = sum(1 for d in done if d.get("recorded") == "waived")
        return [
            (
                1.0,
                Action(text=f"Reviewed {self.items} items, {waived} waived."),
            )
        ]


def scenario(
    kind: str, policy: Checklist, description: str, *, heavy: bool = False
) -> dict[str, Any]:
    return {
        "heavy": heavy,
        "kind": kind,
        "planted": {
            "resample": [2 * i for i in sorted(policy.planted)],
            "observation": [],
            "policy": [],
        },
        "description": description,
    }
