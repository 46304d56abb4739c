"""The verdict: one line that answers "which step should I fix?" from the attribution rows
(as in attribution.parquet) and the tape, for the command line, job.json and the report."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._answer import Answer, legacy_answer, steps_text
from ..tape import LlmEvent, Tape, ToolEvent

Row = Mapping[str, Any]
_WHAT_CHARS = 90


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _call(name: str, arguments: Any) -> str:
    if isinstance(arguments, dict):
        # A recorded tool call keeps positional and keyword arguments apart.
        if set(arguments) <= {"args", "kwargs"} and arguments:
            args = [json.dumps(a, ensure_ascii=False) for a in arguments.get("args") or []]
            kwargs = arguments.get("kwargs") or {}
        else:
            args, kwargs = [], arguments
        args += [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in kwargs.items()]
        return f"{name}({', '.join(args)})"
    return f"{name}({json.dumps(arguments, ensure_ascii=False)})"


def describe_step(event: LlmEvent | ToolEvent, limit: int = _WHAT_CHARS) -> str:
    """What happened at a recorded step, in words: the model's action (the tools it called
    with their arguments, or the start of its text) or the tool's result (or its error)."""
    if isinstance(event, LlmEvent):
        entry: dict[str, Any] = {
            "kind": "llm",
            "action": event.action,
            "provider": event.provider,
            "model": event.model,
        }
    else:
        entry = {
            "kind": "tool",
            "name": event.name,
            "result": event.result,
            "error": event.error.model_dump() if event.error else None,
        }
    return describe_entry(entry, limit)


def describe_entry(entry: Mapping[str, Any], limit: int = _WHAT_CHARS) -> str:
    """The same for an entry of a trajectory (the scorer's list: `kind` llm or tool)."""
    if entry.get("kind") == "llm":
        action = entry.get("action") or {}
        calls = action.get("tool_calls") or []
        if calls:
            shown = ", ".join(_call(str(c.get("name")), c.get("arguments")) for c in calls)
            return _short(f"the model called {shown}", limit)
        text = str(action.get("text") or "")
        if text:
            return _short(f"the model answered {json.dumps(text, ensure_ascii=False)}", limit)
        model = f"{entry.get('provider')}:{entry.get('model')}"
        return _short(f"the model ({model}) answered nothing", limit)
    name = entry.get("name")
    if entry.get("blocked"):
        call = _call(str(name), entry.get("arguments"))
        return _short(f"{call} was attempted (an effect: blocked in a fork)", limit)
    error = entry.get("error")
    if error:
        return _short(f"{name} raised {error.get('type')}: {error.get('message')}", limit)
    return _short(f"{name} returned {json.dumps(entry.get('result'), ensure_ascii=False)}", limit)


def _what(tape: Tape | None, step: int, fallback: str) -> str:
    if tape is not None and 0 <= step < len(tape.steps):
        return describe_step(tape.steps[step])
    return fallback


def _span(v: Any, lo: Any, hi: Any) -> str:
    return f"{v:.2f} [{lo:.2f}, {hi:.2f}]" if None not in (v, lo, hi) else "—"


def _level(rows: Sequence[Row]) -> str:
    levels = {r.get("confidence") for r in rows} - {None}
    return f" at {levels.pop():.0%} confidence" if len(levels) == 1 else ""


def top_cause(rows: Sequence[Row], tape: Tape | None = None) -> dict[str, Any] | None:
    """The job's one rank-1 cause: the re-drawn step with the most blame (φ, the held game),
    with any step whose interval is not separated from it; else the arm with the highest
    flip-rate lower bound (another intervention, or a re-drawn step of a scheme that measures
    flip-rates only). None when no effect was shown."""
    redrawn = [r for r in rows if r.get("intervention") == "resample" and r.get("phi") is not None]
    redrawn.sort(key=lambda r: (r.get("rank") is None, r.get("rank") or 0, -r["phi"]))
    if redrawn and redrawn[0]["phi"] > 0:
        top = redrawn[0]
        tied = [
            r
            for r in redrawn[1:]
            if r.get("rank") is not None
            and (r.get("phi_lo") or 0.0) > 0
            and (r.get("phi_hi") or 0.0) >= (top.get("phi_lo") or 0.0)
        ]
        return {
            "intervention": "resample",
            "measure": "phi",
            "steps": [
                {
                    "step": r["step"],
                    "what": _what(tape, r["step"], r["label"]),
                    "value": r["phi"],
                    "low": r.get("phi_lo"),
                    "high": r.get("phi_hi"),
                    "necessity": r.get("necessity"),
                }
                for r in [top, *tied]
            ],
            "confidence": top.get("confidence"),
        }
    others = [
        r
        for r in rows
        if (r.get("intervention") != "resample" or r.get("phi") is None)
        and r.get("flip_lo") is not None
    ]
    others.sort(key=lambda r: (-r["flip_lo"], -(r["flip_rate"] or 0.0), r["step"]))
    if others and others[0]["flip_lo"] > 0:
        r = others[0]
        return {
            "intervention": r.get("intervention"),
            "measure": "flip_rate",
            "steps": [
                {
                    "step": r["step"],
                    "what": _what(tape, r["step"], r["label"]),
                    "value": r["flip_rate"],
                    "low": r["flip_lo"],
                    "high": r.get("flip_hi"),
                    "necessity": None,
                }
            ],
            "confidence": r.get("confidence"),
        }
    return None


def answer_of(answer: Answer | None, status: str | None, notes: Iterable[str]) -> Answer | None:
    """The job's `Answer`: as the job kept it, or, for a job.json written before answers were
    kept, what its status and notes say (`legacy_answer`)."""
    return answer if answer is not None else legacy_answer(status, list(notes))


def verdict(
    rows: Sequence[Row],
    tape: Tape | None = None,
    status: str | None = None,
    notes: Iterable[str] = (),
    answer: Answer | None = None,
) -> str:
    """One line: the step(s) to fix, what happened there, the effect with its interval and
    the confidence level; or why there is no step to name. It never claims more than the
    job's `Answer`: a job whose budget ended before its top separated names its most likely
    step(s) and says so; "no step to blame" only when every re-drawn step was cleared (or
    examined) and no blame was shown; otherwise "not answered", with the steps not examined
    and what would examine them."""
    answer = answer_of(answer, status, notes)
    top = top_cause(rows, tape)
    ended = "the budget ended" if status in (None, "budget_exhausted") else f"the job {status}"
    if top is None:
        # A job whose status says nothing was measured is believed over rows with a value
        # (a step the screen cleared after a draw or two has phi 0 and no rank).
        measured = status != "nothing_measured" and any(
            r.get("phi") is not None or r.get("flip_n") for r in rows
        )
        if not measured:
            return "verdict: no step measured"
        if answer is not None and not answer.answered and answer.kind != "measured":
            return "verdict: " + _not_answered(answer, rows, ended)
        return "verdict: no step to blame: no intervention changed the outcome"
    level = _level(rows)
    steps = top["steps"]
    if top["measure"] == "phi":
        first = steps[0]
        parts = [
            f"step {s['step']}, where {s['what']} "
            f"(blame φ {_span(s['value'], s['low'], s['high'])})"
            for s in steps
        ]
        head = "fix " + " or ".join(parts)
        if len(steps) > 1:
            head += " (not separated)"
        nec = first["necessity"]
        tail = (
            f"; re-drawing step {first['step']} alone clears the failure {nec:.0%} of the time"
            if nec is not None and len(steps) == 1
            else ""
        )
        if answer is not None and answer.kind in ("lead", "unanswered"):
            # The job's own test of the top did not pass: the leader is a lead, not a verdict.
            head = "most likely " + " or ".join(parts)
            if len(steps) > 1:
                head += " (not told apart)"
            unseen = f", with {answer.unexamined_text()}" if answer.unexamined else ""
            tail += f"; not separated from the other steps: {ended} first{unseen} (see the notes)"
        return f"verdict: {head}{level}{tail}"
    s = steps[0]
    if answer is not None and answer.unexamined:
        lead = f"the re-drawn steps are not answered ({answer.unexamined_text()}); "
    else:
        # Blame not shown is not blame ruled out: say how much the intervals leave room for.
        room = [
            r["phi_hi"]
            for r in rows
            if r.get("intervention") == "resample" and r.get("phi_hi") is not None
        ]
        # Rounded up (a bound must not read below itself), and per step: each is a 95% bound.
        most = math.ceil(round(max(room, default=0.0) * 100, 9)) / 100
        lead = f"no re-drawn step showed blame (each φ at most {most:.2f}); " if room else ""
    return (
        f"verdict: {lead}the {top['intervention']} intervention at step {s['step']}, where "
        f"{s['what']}, flips the outcome {_span(s['value'], s['low'], s['high'])}{level}"
    )


def _not_answered(answer: Answer, rows: Sequence[Row], ended: str) -> str:
    """The verdict of a job that showed no blame and did not clear every step: what was and
    was not examined, and what would examine the rest."""
    if answer.unexamined:
        seen = (
            f"no blame shown among {steps_text(answer.examined)}"
            if answer.examined
            else "no blame shown"
        )
        if answer.cleared:
            seen += f" ({steps_text(answer.cleared)} cleared)"
        return f"not answered: {ended} with {answer.unexamined_text()}, and {seen}" + (
            answer.going_on()
        )
    if answer.examined:
        room = max(
            (r["phi_hi"] if r.get("phi_hi") is not None else r.get("flip_hi") or 0.0)
            for r in rows
            if r.get("intervention") == "resample" and r["step"] in answer.examined
        )
        most = math.ceil(round(room * 100, 9)) / 100
        return (
            f"not answered: {ended} before the blame of {steps_text(answer.examined)} was "
            f"shown above 0 or within the target; none showed blame (each at most {most:.2f})"
            f"{_level(rows)} (see the notes)"
        )
    return f"not answered: {ended} before the top separated (see the notes)"
