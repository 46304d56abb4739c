"""The simulated model of the botched fix, with exact probabilities that depend on the model.

Step 2 writes the file [(p, the wrong 9/5 factor), (1 - p, the right 5/9 factor)] with p =
`P_WRONG_FACTOR[request.model]`: 0.8 for gpt-4o-mini (the recorded model) and 0.05 for
gpt-4o. Every other step is a point mass whatever the model. Re-drawn with the same model,
step 2 fixes the run with probability 0.2; swapped to gpt-4o from step 2 on (the job's policy
intervention), with probability 0.95. No other step can change the outcome."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from car_ray.providers import Action, ChatRequest, ToolCall

from .agent import BETTER_MODEL, FIXED, MODEL, PATH, WRONG_FACTOR

P_WRONG_FACTOR = {MODEL: 0.8, BETTER_MODEL: 0.05}


def _call(name: str, **arguments: Any) -> Action:
    return Action(tool_calls=(ToolCall(name, arguments),))


class BugfixPolicy:
    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        called = [c.name for m in request.messages for c in m.tool_calls]
        results = [json.loads(m.content) for m in request.messages if m.role == "tool"]
        if not called:
            return [(1.0, _call("read_file", path=PATH))]
        if "write_file" not in called:
            if request.model not in P_WRONG_FACTOR:
                raise ValueError(f"no probabilities for model {request.model!r}")
            p = P_WRONG_FACTOR[request.model]
            return [
                (p, _call("write_file", path=PATH, content=WRONG_FACTOR)),
                (1 - p, _call("write_file", path=PATH, content=FIXED)),
            ]
        if "run_tests" not in called:
            return [(1.0, _call("run_tests", revision=results[-1]["revision"]))]
        tests = results[-1]
        if tests["failed"]:
            report = f"Patched {PATH}, but {tests['failed']} test(s) still fail."
        else:
            report = f"Fixed {PATH}: all {tests['passed']} tests pass."
        return [(1.0, Action(text=report))]


POLICY = BugfixPolicy()
SCENARIO = {
    "kind": "policy_fix",
    "planted": {"resample": [2], "observation": [], "policy": [2]},
    "description": (
        "gpt-4o-mini writes the wrong conversion factor at step 2 (p = 0.8); swapping that "
        "step to gpt-4o (p = 0.05) fixes the run."
    ),
}
