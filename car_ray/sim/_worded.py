"""A scenario policy whose every model step varies its wording, as a real model's does
(`Worded`): the noisy suite is each scenario under it.

Each action of the inner policy comes in `wordings` wordings of equal share: a tool call with
a sentence beside it ("Checking the order first."), a text answer with an aside after it
(`SEPARATOR` and a phrase). The inner policy always sees the request with the wording taken
out, so what follows a step depends on its decision alone: wording never changes an outcome,
and a job that holds decisions (`hold = "decisions"`, `decision_text = [DECISION_TEXT]`)
reads each step's decision exactly. The wordings of an action are interchangeable for
everything downstream (`interchangeable`), which lets the truth solver enumerate decisions
rather than wordings. With `wordings` in the thousands a re-draw almost never repeats the
recorded text (the "fresh" class: as with a real model)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import Any

from car_ray.providers import Action, ChatRequest, Message

from ._policy import ScenarioPolicy, distribution_of

SEPARATOR = "\n\n-- "
# The `decision_text` pattern that reads a worded text answer's decision: the text before the
# aside.
DECISION_TEXT = r"^(.*?)\n\n-- "
_OPENERS = (
    "Let me check that.",
    "Looking into it now.",
    "Next, I will call the tool.",
    "One moment while I look this up.",
    "I'll verify this before going on.",
    "Checking the details first.",
    "To be sure, I'm calling the tool.",
    "Gathering what I need.",
)
_ASIDES = (
    "hope this helps",
    "let me know if anything is unclear",
    "that is all for now",
    "happy to look further",
    "done",
    "noted",
    "all set",
    "thanks for waiting",
)


def _phrase(phrases: Sequence[str], w: int) -> str:
    """The w-th phrase: the list's, then numbered past its end (wordings never repeat)."""
    base = phrases[w % len(phrases)]
    return base if w < len(phrases) else f"{base} ({w // len(phrases)})"


class Worded:
    """`inner`, with every action in `wordings` wordings (see the module)."""

    def __init__(self, inner: ScenarioPolicy, wordings: int = 4, *, merge: bool = True) -> None:
        if wordings < 1:
            raise ValueError(f"wordings must be at least 1, got {wordings}")
        self.inner = inner
        self.wordings = wordings
        # False: declare no two wordings alike (the solver then enumerates every wording: the
        # brute force the merged enumeration is checked against).
        self.merge = merge

    def distribution(self, request: ChatRequest) -> Sequence[tuple[float, Action]]:
        out: list[tuple[float, Action]] = []
        for p, action in distribution_of(self.inner, unworded(request)):
            out += [(p / self.wordings, worded(action, w)) for w in range(self.wordings)]
        return out

    def interchangeable(self, action: Action) -> Hashable:
        """The inner action a worded one stands for (as canonical JSON): its wordings are
        alike for everything downstream (with `merge` off, each wording is its own)."""
        return json.dumps((unword(action) if self.merge else action).to_json(), sort_keys=True)


def worded(action: Action, w: int) -> Action:
    """`action` in its w-th wording."""
    if action.tool_calls:
        return replace(action, text=_phrase(_OPENERS, w))
    if action.text:
        return replace(action, text=f"{action.text}{SEPARATOR}{_phrase(_ASIDES, w)}")
    return action


def unword(action: Action) -> Action:
    """A worded action back as the inner policy gave it."""
    if action.tool_calls:
        return replace(action, text=None)
    if action.text and SEPARATOR in action.text:
        return replace(action, text=action.text.split(SEPARATOR, 1)[0])
    return action


def unworded(request: ChatRequest) -> ChatRequest:
    """The request with every assistant message's wording taken out."""
    messages = tuple(_unworded(m) for m in request.messages)
    return replace(request, messages=messages)


def _unworded(message: Message) -> Message:
    if message.role != "assistant":
        return message
    if message.tool_calls:
        return replace(message, content="")
    return replace(message, content=message.content.split(SEPARATOR, 1)[0])


def noisy_variant(name: str, wordings: int = 4) -> tuple[Worded, dict[str, Any]]:
    """The noisy suite's variant of scenario `name` (a module `<name>.policy` on the path,
    with a `POLICY` and perhaps a `SCENARIO`): its policy worded `wordings` ways, and its
    scenario description, planted steps kept."""
    module = importlib.import_module(f"{name}.policy")
    base: dict[str, Any] = dict(getattr(module, "SCENARIO", {}))
    scenario = {
        **base,
        "kind": f"{base.get('kind', name)}_noisy",
        "description": f"{base.get('description', f'jobs/{name}.')} Every model step varies "
        f"its wording ({wordings} ways); the decisions are jobs/{name}'s.",
    }
    return Worded(module.POLICY, wordings=wordings), scenario
