"""What carries the blame across a batch's traces (`summary.parquet`): for each dimension of
the rank-1 cause, how many attributed traces name each key, with a Wilson interval on the
share; and how the traces ended."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Trace = Mapping[str, Any]

# The blame dimensions, in the order the summary lists them: each reads a trace row (a
# `TraceRow` whose rank-1 cause exists) into its key and a sort key for ties, or None when the
# cause has no such key (an llm step that called no tool, a tool step has no model).
_Key = tuple[str, tuple[int | str, ...]] | None


def _step(trace: Trace) -> _Key:
    step, kind = int(trace["top_step"]), trace.get("top_kind")
    return (f"step {step}" + (f" ({kind})" if kind else ""), (step, str(kind or "")))


def _named(field: str, only_kind: str | None = None) -> Callable[[Trace], _Key]:
    def key(trace: Trace) -> _Key:
        value = trace.get(field)
        if value is None or (only_kind is not None and trace.get("top_kind") != only_kind):
            return None
        return (str(value), (str(value),))

    return key


def root_label(step: int, intervention: str | None, tool: str | None) -> str:
    """A root as the batch's summaries name it: its step and the input there, a tool's result
    or (a context arm's) the model step's request ('step 1 (lookup_order result)')."""
    if intervention == "context":
        return f"step {step} (request)"
    return f"step {step} ({tool} result)" if tool else f"step {step} (tool result)"


def _root(trace: Trace) -> _Key:
    """The failure's root a trace names (`TraceRow.root_*`)."""
    if trace.get("root_step") is None:
        return None
    step = int(trace["root_step"])
    label = root_label(step, trace.get("root_intervention"), trace.get("root_tool"))
    return (label, (step, label))


_BLAME: tuple[tuple[str, Callable[[Trace], _Key]], ...] = (
    ("root", _root),
    ("step", _step),
    ("tool", _named("top_tool")),
    ("model", _named("top_model", only_kind="llm")),
    ("intervention", _named("top_intervention")),
)


def summarize(
    traces: Sequence[Mapping[str, Any]], confidence: float = 0.95
) -> list[dict[str, Any]]:
    """`SummaryRow`s: over the traces with a rank-1 cause (`top_step` set), how many name each
    root (the input whose replacement cleared the failure, where the trace's arms show one),
    and each step, tool, model (llm causes only) and intervention kind of the rank-1 cause,
    out of all attributed traces (so a dimension's shares sum to less than 1 where a trace
    names no root or its cause has no such key); then each
    `status` over all traces, and each `answer` over the traces whose job ran. Wilson
    intervals at `confidence`; rows by dimension (that order), then most traces first."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    # Here, not at the top: `car_ray.schedule` imports Ray, and `car_ray.results` is also
    # what recording in production imports.
    from ..schedule import wilson

    attributed = [t for t in traces if t.get("top_step") is not None]
    dimensions = [(name, attributed, key) for name, key in _BLAME]
    dimensions.append(("status", list(traces), lambda t: (str(t["status"]), (str(t["status"]),))))
    # What each job that ran could claim (`Answer.kind`): an unanswered trace is counted as
    # such, never as one with nothing to blame.
    ran = [t for t in traces if t.get("answer")]
    dimensions.append(("answer", ran, lambda t: (str(t["answer"]), (str(t["answer"]),))))
    rows: list[dict[str, Any]] = []
    for dimension, over, key_of in dimensions:
        counts: dict[str, int] = {}
        order: dict[str, tuple[int | str, ...]] = {}
        for trace in over:
            found = key_of(trace)
            if found is not None:
                counts[found[0]] = counts.get(found[0], 0) + 1
                order[found[0]] = found[1]
        for key in sorted(counts, key=lambda k: (-counts[k], order[k])):
            lo, hi = wilson(counts[key], len(over), 1.0 - confidence)
            rows.append(
                {
                    "dimension": dimension,
                    "key": key,
                    "traces": counts[key],
                    "of": len(over),
                    "share": counts[key] / len(over),
                    "share_lo": lo,
                    "share_hi": hi,
                    "confidence": confidence,
                }
            )
    return rows
