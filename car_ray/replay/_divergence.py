"""The one divergence type: a replayed run asked for something the tape did not record."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    path: str
    expected: str
    observed: str


def _preview(value: Any, limit: int = 120) -> str:
    text = (
        value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


_MISSING = object()


def _string_window(a: str, b: str, context: int = 40) -> tuple[str, str]:
    """Both strings around where they first differ, so a long prompt's edit is visible."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    lead = max(0, start - context)
    prefix = "…" if lead else ""

    def cut(text: str) -> str:
        window = text[lead : start + context]
        tail = "…" if len(text) > start + context else ""
        return json.dumps(prefix + window + tail, ensure_ascii=False)

    return cut(a), cut(b)


def json_diff(expected: Any, observed: Any, path: str = "$", limit: int = 20) -> list[Difference]:
    """Where two JSON values differ, by JSON path, deepest first found, at most `limit`."""
    out: list[Difference] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if len(out) >= limit or a == b:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in list(a) + [k for k in b if k not in a]:
                walk(a.get(key, _MISSING), b.get(key, _MISSING), f"{where}.{key}")
            return
        if isinstance(a, list) and isinstance(b, list):
            for i in range(max(len(a), len(b))):
                walk(
                    a[i] if i < len(a) else _MISSING,
                    b[i] if i < len(b) else _MISSING,
                    f"{where}[{i}]",
                )
            return
        if isinstance(a, str) and isinstance(b, str):
            out.append(Difference(where, *_string_window(a, b)))
            return
        out.append(
            Difference(
                where,
                "(absent)" if a is _MISSING else _preview(a),
                "(absent)" if b is _MISSING else _preview(b),
            )
        )

    walk(expected, observed, path)
    return out


class DivergenceError(Exception):
    """The run left the tape at `step`: what differs, where, and what was expected."""

    def __init__(self, step: int, reason: str, differences: list[Difference] | None = None) -> None:
        self.step = step
        self.reason = reason
        self.differences = differences or []
        super().__init__(self.render())

    def __reduce__(self) -> tuple[Any, ...]:  # crosses processes (a Ray worker) whole
        return (type(self), (self.step, self.reason, self.differences), self.__dict__)

    def render(self) -> str:
        lines = [f"divergence at step {self.step}: {self.reason}"]
        for d in self.differences:
            lines.append(f"  at {d.path}: expected {d.expected}  observed {d.observed}")
        return "\n".join(lines)

    def summary(self) -> str:
        """One line for a result row."""
        first = self.differences[0].path if self.differences else ""
        return f"step {self.step}: {self.reason}" + (f" (first at {first})" if first else "")
