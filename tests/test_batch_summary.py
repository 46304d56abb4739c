"""The batch summary: what carries the blame across traces, counted by hand, with Wilson
intervals checked against the interval's own definition."""

from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

import pytest

from car_ray.results import SUMMARY_ROWS, TraceRow, read_rows, summarize, write_rows

# (trace, status, top step, kind, tool, model, intervention); None: no rank-1 cause.
TRACES = [
    ("a0", "complete", 4, "llm", "refund", "openai:gpt-4o-mini", "resample"),
    ("a1", "complete", 4, "llm", "refund", "openai:gpt-4o-mini", "resample"),
    ("a2", "budget_exhausted", 4, "llm", None, "anthropic:claude-3-5-haiku", "resample"),
    ("a3", "complete", 2, "tool", "lookup_order", None, "observation"),
    # A tool step's model is not a model to blame (llm causes only), even if a row has one.
    ("a4", "complete", 2, "tool", "lookup_order", "openai:gpt-4o-mini", "observation"),
    ("a5", "budget_exhausted", 10, "llm", "refund", "openai:gpt-4o-mini", "policy"),
    ("a6", "complete", 3, "tool", "search", None, "resample"),
    ("u7", "budget_exhausted", None, None, None, None, None),
    ("u8", "corrupt", None, None, None, None, None),
    ("u9", "corrupt", None, None, None, None, None),
]
# The roots some traces name: (step, intervention, the tool whose result it is).
ROOTS = {
    "a0": (1, "observation", "lookup_order"),
    "a1": (1, "observation", "lookup_order"),
    "a2": (0, "context", None),
    "a5": (1, "observation", "lookup_order"),
}

# Counted by hand from TRACES and ROOTS: (dimension, key, traces, of), in the order the
# summary lists them. 7 traces are attributed; ties (step 3 and step 10, once each) go by
# step number.
EXPECTED = [
    ("root", "step 1 (lookup_order result)", 3, 7),
    ("root", "step 0 (request)", 1, 7),
    ("step", "step 4 (llm)", 3, 7),
    ("step", "step 2 (tool)", 2, 7),
    ("step", "step 3 (tool)", 1, 7),
    ("step", "step 10 (llm)", 1, 7),
    ("tool", "refund", 3, 7),
    ("tool", "lookup_order", 2, 7),
    ("tool", "search", 1, 7),
    ("model", "openai:gpt-4o-mini", 3, 7),
    ("model", "anthropic:claude-3-5-haiku", 1, 7),
    ("intervention", "resample", 4, 7),
    ("intervention", "observation", 2, 7),
    ("intervention", "policy", 1, 7),
    ("status", "complete", 5, 10),
    ("status", "budget_exhausted", 3, 10),
    ("status", "corrupt", 2, 10),
]
TOLERANCE = 1e-12  # both sides are the same real numbers in double precision


def trace_rows() -> list[dict[str, Any]]:
    rows = []
    for trace, status, step, kind, tool, model, intervention in TRACES:
        row = TraceRow(
            trace=trace,
            tape=f"tapes/{trace}.tape",
            folder=f"trace={trace}",
            status=status,
            top_step=step,
            top_kind=kind,
            top_tool=tool,
            top_model=model,
            top_intervention=intervention,
        )
        if trace in ROOTS:
            row.root_step, row.root_intervention, row.root_tool = ROOTS[trace]
        rows.append(row.model_dump())
    return rows


def wilson_roots(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """The Wilson interval by its definition: the p with |p_hat - p| <= z sqrt(p (1 - p) / n),
    the two roots of (1 + z²/n) p² - (2 p_hat + z²/n) p + p_hat² = 0."""
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    p_hat = successes / n
    a, b, c = 1 + z * z / n, -(2 * p_hat + z * z / n), p_hat * p_hat
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_counts_shares_and_wilson_intervals(confidence: float) -> None:
    rows = summarize(trace_rows(), confidence)
    got = [(r["dimension"], r["key"], r["traces"], r["of"]) for r in rows]
    assert got == EXPECTED
    for row in rows:
        lo, hi = wilson_roots(row["traces"], row["of"], confidence)
        assert row["share"] == row["traces"] / row["of"]
        assert row["share_lo"] == pytest.approx(lo, abs=TOLERANCE)
        assert row["share_hi"] == pytest.approx(hi, abs=TOLERANCE)
        assert row["share_lo"] < row["share"] < row["share_hi"]
        assert row["confidence"] == confidence


def test_a_key_every_trace_names_reaches_one() -> None:
    rows = summarize([r for r in trace_rows() if r["top_step"] == 4], 0.95)
    step = next(r for r in rows if r["dimension"] == "step")
    assert (step["key"], step["traces"], step["of"], step["share"]) == ("step 4 (llm)", 3, 3, 1.0)
    assert step["share_hi"] == 1.0
    assert step["share_lo"] == pytest.approx(wilson_roots(3, 3, 0.95)[0], abs=TOLERANCE)


def test_no_attributed_trace_leaves_only_how_they_ended() -> None:
    rows = summarize([r for r in trace_rows() if r["top_step"] is None])
    assert [(r["dimension"], r["key"], r["traces"], r["of"]) for r in rows] == [
        ("status", "corrupt", 2, 3),
        ("status", "budget_exhausted", 1, 3),
    ]
    assert summarize([]) == []


def test_the_summary_is_a_summary_parquet(tmp_path: Path) -> None:
    rows = summarize(trace_rows())
    write_rows(tmp_path, "batch-1", "summary.parquet", SUMMARY_ROWS, rows)
    assert read_rows(tmp_path, "batch-1", "summary.parquet") == rows


def test_a_confidence_outside_zero_and_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"confidence must be in \(0, 1\), got 95"):
        summarize(trace_rows(), 95)
