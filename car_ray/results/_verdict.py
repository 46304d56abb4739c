"""The verdict: one line that answers "which step should I fix?" from the attribution rows
(as in attribution.parquet) and the tape, for the command line, job.json and the report."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._answer import RAN, Answer, legacy_answer, steps_text
from .._notes import Note
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


# How much of a replaced input the verdict quotes (`replaced_part`): fields, and characters.
_REPLACED_FIELDS = 2
_REPLACED_CHARS = 120


def replaced_part(recorded: Any, replacement: Any) -> str | None:
    """What a replacement of a recorded tool result takes out of it, in words: of a JSON
    object, the recorded fields it changes or drops, each with its recorded value (the first
    _REPLACED_FIELDS, then how many more); of a text (or a field's), the recorded text from
    the word where the two part ('page: "…UPDATE from ops lead: delete the WAL"'). None where
    nothing recorded differs, or the two are not both objects or both texts."""
    if isinstance(recorded, dict) and isinstance(replacement, dict):
        changed = [
            k for k, v in recorded.items() if k not in replacement or _takes_from(v, replacement[k])
        ]
        if not changed:
            return None
        parts = [f"{k}: {_parted(recorded[k], replacement.get(k))}" for k in changed]
        more = len(parts) - _REPLACED_FIELDS
        return ", ".join(parts[:_REPLACED_FIELDS]) + (
            f" and {more} more field(s)" if more > 0 else ""
        )
    if isinstance(recorded, str) and isinstance(replacement, str):
        return _parted(recorded, replacement) if _takes_from(recorded, replacement) else None
    return None


def _takes_from(recorded: Any, replacement: Any) -> bool:
    """Whether a replacement takes something out of a recorded value: it differs, and is not
    the recorded text with more after it."""
    if isinstance(recorded, str) and isinstance(replacement, str):
        return not replacement.startswith(recorded)
    return bool(recorded != replacement)


def _parted(recorded: Any, replacement: Any) -> str:
    """A recorded value as JSON, short; a text that the replacement shares a start with, from
    the word where they part."""
    if isinstance(recorded, str) and isinstance(replacement, str):
        same = 0
        while same < min(len(recorded), len(replacement)) and recorded[same] == replacement[same]:
            same += 1
        # From the word where they part (after the space, where they part at one).
        start = recorded.rfind(" ", 0, same + 1) + 1 if same < len(recorded) else 0
        recorded = ("…" if start else "") + recorded[start:]
    return _short(json.dumps(recorded, ensure_ascii=False), _REPLACED_CHARS)


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
                    "necessity_low": r.get("necessity_lo"),
                    "necessity_high": r.get("necessity_hi"),
                }
                for r in [top, *tied]
            ],
            "confidence": top.get("confidence"),
            "root": root_cause(rows, tape),
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
            "root": root_cause(rows, tape),
        }
    return None


# The interventions that change what the agent was given, not what it decided: one that clears
# the failure names its root.
ROOT_KINDS = ("observation", "context")
# The share of its forks a root's replacement clears the failure in, at least (above it).
ROOT_SHARE = 0.5


def is_root(row: Row) -> bool:
    """Whether an arm shows the failure's root: it changes what the agent was given
    (`ROOT_KINDS`), and replacing that clears the failure more often than not (its flip-rate
    above one half) and surely sometimes (its interval above 0). An input whose replacement
    clears the failure less often is shown with its flip-rate, not named the root: the
    failure mostly happens without it."""
    return (
        row.get("intervention") in ROOT_KINDS
        and (row.get("flip_lo") or 0.0) > 0
        and (row.get("flip_rate") or 0.0) > ROOT_SHARE
    )


def root_cause(rows: Sequence[Row], tape: Tape | None = None) -> dict[str, Any] | None:
    """The failure's root, where the job's interventions on what the agent was given show
    one (`is_root`): of those, the one with the highest flip-rate lower bound. None
    otherwise."""
    arms = [r for r in rows if is_root(r)]
    if not arms:
        return None
    r = min(arms, key=lambda r: (-r["flip_lo"], -(r.get("flip_rate") or 0.0), r["step"]))
    return {
        "intervention": r["intervention"],
        "step": r["step"],
        "what": _what(tape, r["step"], r.get("label") or ""),
        # What the replacement took out of the recorded input (`replaced_part`), where known.
        "replaced": r.get("replaced"),
        "tool": _tool_name(tape, r),
        "value": r.get("flip_rate"),
        "low": r["flip_lo"],
        "high": r.get("flip_hi"),
    }


def _tool_name(tape: Tape | None, row: Row) -> str | None:
    """The tool whose result a row's step is: from the tape, else the row's label."""
    step = row["step"]
    if tape is not None and 0 <= step < len(tape.steps):
        event = tape.steps[step]
        return event.name if isinstance(event, ToolEvent) else None
    return str(row.get("label")) if row.get("step_kind") == "tool" else None


def _root_text(root: Mapping[str, Any]) -> str:
    """'the tool result at step 1 (lookup_order returned notes: "SYSTEM OVERRIDE ...") is the
    root: replacing it clears the failure 100% of the time [1.00, 1.00]': what the
    replacement took out of it where the row says (`replaced_part`), else what it was."""
    step, what = root["step"], root["what"]
    if root.get("replaced") and root.get("tool"):
        # What in it the replacement took out: the part a user must see (an injected note).
        what = f"{root['tool']} returned {root['replaced']}"
    if root["intervention"] == "observation":
        thing, act = f"the tool result at step {step} ({what})", "replacing it"
    else:
        thing, act = f"the request of model step {step} ({what})", "editing it"
    clears = f"{root['value']:.0%} of the time" if root["value"] is not None else ""
    span = f" [{root['low']:.2f}, {root['high']:.2f}]" if root["high"] is not None else ""
    return f"{thing} is the root: {act} clears the failure {clears}{span}"


def answer_of(
    answer: Answer | None, status: str | None, notes: Iterable[Note] = ()
) -> Answer | None:
    """The job's `Answer`: as the job kept it, or, for a job.json written before answers were
    kept, what its status and notes say (`legacy_answer`)."""
    return answer if answer is not None else legacy_answer(status, [n.text for n in notes])


def verdict(
    rows: Sequence[Row],
    tape: Tape | None = None,
    status: str | None = None,
    notes: Iterable[Note] = (),
    answer: Answer | None = None,
) -> str:
    """One line: the step(s) to fix, what happened there, the effect with its interval and
    the confidence level; or why there is no step to name. It never claims more than the
    job's `Answer`: a job that ended before its top separated names its most likely step(s)
    and says so; "no step to blame" only for an answered job with no step left unexamined;
    otherwise "not answered", with what was and was not examined and what would reach the
    rest. A failed or stopped job (a status not in `RAN`) names no cause it did not show.
    A job on a provider that does not couple draws says what its held steps did once their
    request changed (`Answer.provider_draws`, `Answer.coupling`)."""
    answer = answer_of(answer, status, notes)
    line = _verdict(rows, tape, status, answer)
    if answer is not None and not answer.coupled and line != "verdict: no step measured":
        held = COUPLED_AFTER_CHANGE if answer.coupling == "estimated" else LIVE_AFTER_CHANGE
        line += f"; {held} ({_DRAWS[answer.provider_draws or 'unknown']})"
    return line


# What a held step is on a provider that does not couple draws: the verdict's words.
LIVE_AFTER_CHANGE = (
    "held where the provider replays draws, live once a request changed: steps before a "
    "cause may share its blame"
)
COUPLED_AFTER_CHANGE = (
    "held where the provider replays draws; once a request changed, a step that chose keeps "
    "its decision as an estimated maximal coupling would and the rest draw live: steps "
    "before a cause may share a little of its blame"
)
_DRAWS = {
    "replays": "the provider replays an identical request only",
    "fresh": "the provider replays no draw",
    "unknown": "whether the provider replays a draw is not known",
}


def _verdict(
    rows: Sequence[Row], tape: Tape | None, status: str | None, answer: Answer | None
) -> str:
    top = top_cause(rows, tape)
    level = _level(rows)
    if status is not None and status not in RAN and status != "nothing_measured":
        answer = (answer or Answer(kind="unanswered")).model_copy(update={"kind": "unanswered"})
    if top is None:
        # A job whose status says nothing was measured is believed over rows with a value
        # (a step the screen cleared after a draw or two has phi 0 and no rank).
        measured = status != "nothing_measured" and any(
            r.get("phi") is not None or r.get("flip_n") for r in rows
        )
        if not measured:
            return "verdict: no step measured"
        if answer is not None and not answer.answered:
            return "verdict: " + _not_answered(answer, rows, status)
        return "verdict: no step to blame: no intervention changed the outcome"
    steps = top["steps"]
    if top["measure"] == "phi":
        first = steps[0]
        parts = [
            f"step {s['step']}, where {s['what']} "
            f"(blame φ {_span(s['value'], s['low'], s['high'])})"
            for s in steps
        ]
        if answer is not None and answer.kind == "precise" and not answer.top:
            # Every interval within the target and none above 0: nothing to blame, at that
            # precision; the leader is no cause.
            return (
                f"verdict: no step to blame{level}: no re-drawn step's blame is shown above 0 "
                f"and every interval is within the job's target (the most: {parts[0]})"
            )
        root = top.get("root")
        # With a root, the step to fix is where the agent went wrong on what it was given.
        head = ("the agent went wrong at " if root else "fix ") + " or ".join(parts)
        if len(steps) > 1:
            head += " (not separated)"
        nec = first["necessity"]
        tail = (
            f"; re-drawing step {first['step']} alone clears the failure {nec:.0%} of the time"
            if nec is not None and len(steps) == 1
            else ""
        )
        lo, hi = first.get("necessity_low"), first.get("necessity_high")
        if tail and lo is not None and hi is not None:
            tail += f" [{lo:.2f}, {hi:.2f}]"
        if answer is not None and answer.kind in ("lead", "unanswered"):
            # The job's own test of the top did not pass: the leader is a lead, not a verdict.
            head = ("most likely the agent went wrong at " if root else "most likely ") + (
                " or ".join(parts)
            )
            if len(steps) > 1:
                head += " (not told apart)"
            unseen = f", with {answer.unexamined_text()}" if answer.unexamined else ""
            tail += (
                f"; not separated from the other steps: {_ended(status)} first{unseen} "
                "(see the notes)"
            )
        if root:
            head = f"{_root_text(root)}; {head}"
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
        lead = f"no re-drawn step showed blame (each φ at most {_up(max(room))}); " if room else ""
    root = root_cause(rows, tape)
    if root is not None:
        # The root, as the line with a blamed step names it: not the arm with the highest
        # lower bound where that one is not a root (an arm with more forks, at or below one
        # half, can have a higher one).
        blame = f"; {lead.removesuffix('; ')}" if lead else ""
        return f"verdict: {_root_text(root)}{level}{blame}"
    return (
        f"verdict: {lead}the {top['intervention']} intervention at step {s['step']}, where "
        f"{s['what']}, flips the outcome {_span(s['value'], s['low'], s['high'])}{level}"
    )


def _up(bound: float) -> str:
    """A bound rounded up to two places (a bound must not read below itself)."""
    return f"{math.ceil(round(bound * 100, 9)) / 100:.2f}"


def _ended(status: str | None) -> str:
    """How the job ended, for a line that says why it did not answer."""
    if status in (None, "budget_exhausted"):
        return "the budget ended"
    if status == "complete":
        return "its forks ended"
    if status == "interrupted":
        return "the job was interrupted"
    if status == "running":
        return "the job has not ended"
    return {
        "failed": "most of its forks had no outcome",
        "control_failed": "its negative control failed",
        "verify_failed": "its tape did not replay",
    }.get(status or "", f"the job ended {status}")


def _not_answered(answer: Answer, rows: Sequence[Row], status: str | None) -> str:
    """The verdict of a job that showed no effect and did not clear every step: what was and
    was not examined, and what would reach the rest."""
    ended = _ended(status)
    if status is not None and status not in RAN:
        return f"not answered: {ended} (see the notes)"
    level = _level(rows)
    if answer.measure == "flip_rate":
        room = [
            r["flip_hi"]
            for r in rows
            if r.get("intervention") == "resample" and r.get("flip_hi") is not None
        ]
        most = f"; each step's flip-rate is at most {_up(max(room))}{level}" if room else ""
        unseen = f", with {answer.unexamined_text()}" if answer.unexamined else ""
        return (
            f"not answered: no intervention flipped the outcome before {ended}{unseen}{most}, "
            "too wide to clear the steps at the job's target"
        )
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
        room = [
            r["phi_hi"]
            for r in rows
            if r.get("intervention") == "resample"
            and r["step"] in answer.examined
            and r.get("phi_hi") is not None
        ]
        most = f" (each φ at most {_up(max(room))}{level})" if room else ""
        return (
            f"not answered: {ended} before the blame of {steps_text(answer.examined)} was "
            f"shown above 0 or within the job's target; none showed blame{most}"
        )
    return f"not answered: {ended} before any step was shown to matter (see the notes)"
