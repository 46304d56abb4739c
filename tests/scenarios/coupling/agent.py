"""A three-step support agent whose second step's chances depend on its first: the scenario
on which the held game and the maximal game differ (tests/test_truth.py). The tape has 3
steps: 0 llm (the plan), 1 llm (the decision), 2 llm (a supervisor's word, or closing).

Sync openai SDK, non-streaming, text answers only."""

from __future__ import annotations

from typing import Any

import car_ray

MODEL = "gpt-4o-mini"
SYSTEM = "You handle a refund ticket: choose a plan, decide, then close or hand it up."


def support_agent(ctx: car_ray.AgentContext) -> dict[str, Any]:
    client = ctx.openai()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Ticket {ctx.input['ticket']}: a refund request."},
    ]
    answers: list[str] = []
    for _ in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=messages)
        text = reply.choices[0].message.content or ""
        answers.append(text)
        messages.append({"role": "assistant", "content": text})
        messages.append({"role": "user", "content": "Go on."})
    return {"answers": answers}


def refunded(result: Any, trajectory: list[dict[str, Any]]) -> float:
    """1.0 when any step refunded (the bad outcome)."""
    answers = result.get("answers", []) if isinstance(result, dict) else []
    return 1.0 if "Refund." in answers else 0.0
