"""A payout review whose every model step varies its wording, as a real model's does.

The agent walks a checklist of `STEPS` items, one model call each; each reply is a free-text
note in one of several wordings that change nothing downstream. At item `DECISION` the model
decides the payout: approving it is the bad outcome. Only that step can be blamed; the notes
before it leave the tape whenever they are re-drawn, so a screen that reads the text takes
every one of them for a choice. The sync openai SDK, non-streaming; one step a model call.
"""

from __future__ import annotations

from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
STEPS = 14
DECISION = 11
SYSTEM = "You review a payout request item by item, one short note an item, then decide."


def review_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Review payout {ctx.input['payout']}: item 0."},
    ]
    notes: list[str] = []
    for item in range(STEPS):
        reply = client.chat.completions.create(model=MODEL, messages=messages)
        text = reply.choices[0].message.content or ""
        notes.append(text)
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": f"item {item + 1}."})
    return {"notes": notes}


def payout_approved(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when the review approved the payout."""
    notes = result.get("notes", []) if isinstance(result, dict) else []
    return 1.0 if any("approve the payout" in n for n in notes) else 0.0
