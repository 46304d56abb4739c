"""What a model step decided, apart from how it worded it (`Decisions`).

A real model re-drawn at temperature > 0 rarely repeats its words, and the words rarely
change what happens next. A job that holds decisions (`hold = "decisions"`) reads a model
step's decision as its tool calls (names and arguments; any text beside them is wording),
and a text-only answer's as what the first of the job's `decision_text` patterns that
matches it captures (its groups, or the whole match), else the whole text. A fork then
"stays on the tape" at a step that drew its recorded decision in other words: the screen
counts that draw as clean, and a probe after it still draws at what is, decision for
decision, the recorded request. What it cannot see: an effect carried by wording alone (a
later step that decides otherwise because an earlier one phrased the same decision
differently)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class DecisionPatternError(ValueError):
    """A `decision_text` pattern that is not a regular expression."""


@dataclass(frozen=True)
class Decisions:
    """How a job reads a model step's decision; `hold` "actions" (the default) compares
    whole actions, words included."""

    hold: str = "actions"
    text: tuple[str, ...] = ()
    _compiled: tuple[re.Pattern[str], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = []
        for i, pattern in enumerate(self.text):
            try:
                compiled.append(re.compile(pattern, re.DOTALL))
            except re.error as exc:
                raise DecisionPatternError(
                    f"decision_text[{i}] {pattern!r} is not a regular expression ({exc})"
                ) from None
        object.__setattr__(self, "_compiled", tuple(compiled))

    @classmethod
    def of(cls, hold: str, text: Sequence[str] = ()) -> Decisions:
        return cls(hold=hold, text=tuple(text))

    @property
    def by_decision(self) -> bool:
        return self.hold == "decisions"

    def decision(self, action: Mapping[str, Any] | None) -> Any:
        """What an action (a trajectory entry's `action`: text and tool calls) decided."""
        if not self.by_decision:
            return action
        action = action or {}
        calls = action.get("tool_calls") or []
        if calls:
            return [(c.get("name"), json.dumps(c.get("arguments"), sort_keys=True)) for c in calls]
        text = action.get("text")
        if not text:
            return None
        for pattern in self._compiled:
            match = pattern.search(str(text))
            if match is not None:
                return list(match.groups()) or match.group(0)
        return text

    def same(self, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
        """Whether two actions made the same decision."""
        return bool(self.decision(a) == self.decision(b))


ACTIONS = Decisions()
