"""The batch's (or sweep's) report page: one self-contained HTML page, no script, that works
offline. What carries the blame across the traces (`summary.parquet`, each share with its
interval), then every trace (or sweep cell) with the root it names, its rank-1 cause and its
verdict line (as `show` words it), its spend and, when the trace wrote one, a link to its own
report. Everything recorded (tape paths, reasons, tool and
model names, a cell's settings) is HTML-escaped before it reaches the page."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from .._answer import ANSWERED
from ..results import BatchInfo, JobDir, TraceRow, root_label
from ._page import budget_facts, esc, facts_list, fmt, fmt_count, or_dash, page

Summary = Mapping[str, Any]

# The summary's blame dimensions, in page order, with their headings.
_DIMENSIONS = (
    ("root", "Roots: the input whose replacement cleared the failure"),
    ("step", "Steps"),
    ("tool", "Tools"),
    ("model", "Models"),
    ("intervention", "Intervention kinds"),
)
_OK = {"complete"}
_WARN = {"budget_exhausted", "nothing_measured", "pending", "interrupted", "running"}


def write_batch_report(
    out: str,
    info: BatchInfo,
    traces: Sequence[TraceRow],
    summary: Sequence[Summary],
) -> str:
    """Write `<out>/<batch_id>/report.html` (whole or not at all) and return where. A trace's
    link is there only if its folder holds a report.html."""
    folder = JobDir.of(out, info.batch_id)
    reports = {r.folder for r in traces if folder.info(r.folder, "report.html").is_file}
    html = render_batch_report(info, traces, summary, reports=reports)
    folder.write_atomic(html.encode("utf-8"), "report.html")
    return folder.join("report.html")


def render_batch_report(
    info: BatchInfo,
    traces: Sequence[TraceRow],
    summary: Sequence[Summary],
    *,
    reports: Collection[str] = (),
) -> str:
    """The page as one HTML string. `reports`: the trace folders (`trace=<id>`) that hold a
    report.html, linked relative to the batch folder's report.html."""
    word = "cells" if info.kind == "sweep" else "traces"
    body = "\n".join(
        [
            _header(info, traces, word),
            _blame(summary, word),
            _traces(info, traces, reports, word),
        ]
    )
    return page(f"car-ray {info.kind} · {info.batch_id}", body, css=_CSS)


def _header(info: BatchInfo, traces: Sequence[TraceRow], word: str) -> str:
    status = info.status
    status_class = "ok" if status in _OK else "warn"
    attributed = [r for r in traces if r.top_step is not None]
    line = f"{len(attributed)} of {len(traces)} {word} have a rank-1 cause"
    rooted = [r for r in traces if r.root_step is not None]
    if rooted:
        line += f", {len(rooted)} of them a root"
    open_ = [r for r in traces if r.answer is not None and r.answer not in ANSWERED]
    if open_:
        line += f"; {len(open_)} not answered"
    planted = [r for r in traces if r.planted_step is not None]
    if planted:
        named = sum(1 for r in planted if r.top_step == r.planted_step)
        line += f"; the planted step is rank 1 in {named} of {len(planted)}"
    counts: dict[str, int] = {}
    for r in traces:
        counts[r.status] = counts.get(r.status, 0) + 1
    facts = [
        (info.kind, f"<code>{esc(info.batch_id)}</code>"),
        (
            "job files" if len(info.job_files) > 1 else "job file",
            ", ".join(f"<code>{esc(f)}</code>" for f in info.job_files or [or_dash(info.job_file)]),
        ),
        ("split", esc(info.split)),
        (word, esc(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none")),
        ("runs", esc(info.runs)),
        ("started", esc(or_dash(info.started))),
        ("finished", esc(or_dash(info.finished))),
    ]
    spend = {"wall_s": info.wall_s, **info.spent.model_dump()}
    budget = info.budget.model_dump() if info.budget else {}
    facts += [(name, esc(shown)) for name, shown in budget_facts(spend, budget)]
    if info.busy_share is not None:
        facts.append(("pool busy", esc(f"{info.busy_share:.0%} of wall time")))
    notes = "".join(f'<p class="note">{esc(note)}</p>' for note in info.notes)
    return f"""<header>
<h1>car-ray {esc(info.kind)} <span class="status {status_class}">{esc(status)}</span></h1>
<p class="verdict">{esc(line)}</p>
{facts_list(facts)}
{notes}
<details><summary>{esc(info.kind)} (as recorded in batch.json)</summary>
<pre>{esc(info.model_dump_json(indent=2))}</pre></details>
</header>"""


def _blame(summary: Sequence[Summary], word: str) -> str:
    """A table per dimension: each key's count and share of the attributed traces, as a bar
    with its interval."""
    parts = ['<section id="blame"><h2>What carries the blame</h2>']
    rows = [s for s in summary if s["dimension"] not in ("status", "answer")]
    if not rows:
        parts.append(f'<p class="legend">No {esc(word)} have a rank-1 cause yet.</p>')
    else:
        of, confidence = rows[0]["of"], float(rows[0]["confidence"])
        parts.append(
            f'<p class="legend">Share of the {esc(of)} attributed {esc(word)} that name each '
            f"root, and whose rank-1 cause has each key, with a Wilson interval at "
            f"{confidence:.0%}.</p>"
        )
    ended = (("status", "How they ended"), ("answer", "What each job could claim"))
    for dimension, heading in (*_DIMENSIONS, *ended):
        mine = [s for s in summary if s["dimension"] == dimension]
        if not mine:
            continue
        body = "".join(_share_row(s) for s in mine)
        parts.append(
            f'<h3>{esc(heading)}</h3><table class="blame" data-dimension="{esc(dimension)}">'
            f'<thead><tr><th>{esc(dimension)}</th><th class="num">{esc(word)}</th>'
            f'<th class="num">share [interval]</th><th class="bar"></th></tr></thead>'
            f"<tbody>{body}</tbody></table>"
        )
    parts.append("</section>")
    return "\n".join(parts)


def _share_row(s: Summary) -> str:
    share, lo, hi = (100.0 * float(s[k]) for k in ("share", "share_lo", "share_hi"))
    bar = (
        f'<div class="track"><div class="fill" style="width:{share:.1f}%"></div>'
        f'<div class="whisker" style="left:{lo:.1f}%;width:{max(hi - lo, 0.3):.1f}%"></div>'
        "</div>"
    )
    interval = f"{fmt(s['share'], 2)} [{fmt(s['share_lo'], 2)}, {fmt(s['share_hi'], 2)}]"
    return (
        f"<tr><td><code>{esc(s['key'])}</code></td>"
        f'<td class="num">{esc(s["traces"])} of {esc(s["of"])}</td>'
        f'<td class="num">{esc(interval)}</td><td class="bar">{bar}</td></tr>'
    )


def _traces(
    info: BatchInfo, traces: Sequence[TraceRow], reports: Collection[str], word: str
) -> str:
    sweep = info.kind == "sweep"
    planted = any(r.planted_step is not None for r in traces)
    heads = [word[:-1], *(["settings"] if sweep else []), "status", "root", "rank-1 cause"]
    heads += ["value [interval]", *(["planted"] if planted else []), "forks", "cost", "tape"]
    numeric = {"value [interval]", "forks", "cost"}
    head = "".join(
        f'<th class="num">{esc(h)}</th>' if h in numeric else f"<th>{esc(h)}</th>" for h in heads
    )
    body = "".join(_trace_row(r, r.folder in reports, sweep, planted) for r in traces)
    title = "Cells compared" if sweep else "Traces"
    return (
        f'<section id="traces"><h2>{esc(title)}</h2>'
        f'<table class="traces"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
        "</section>"
    )


def _trace_row(r: TraceRow, linked: bool, sweep: bool, planted: bool) -> str:
    name = f"<code>{esc(r.trace)}</code>"
    if linked:
        name = f'<a href="{esc(quote(f"{r.folder}/report.html"))}">{name}</a>'
    status_class = "ok" if r.status in _OK else "warn"
    status = f'<span class="status {status_class}">{esc(r.status)}</span>'
    if r.reason:
        status += f'<div class="reason">{esc(r.reason)}</div>'
    value = "—"
    if r.top_value is not None:
        interval = f"{fmt(r.top_value, 2)} [{fmt(r.top_lo, 2)}, {fmt(r.top_hi, 2)}]"
        measure = _MEASURES.get(r.top_measure or "", r.top_measure)
        value = f"{measure} {interval}" if measure else interval
    # (HTML, numeric) per column, in the order `_traces` heads them.
    cells = [(name, False)]
    if sweep:
        settings = json.loads(r.settings) if r.settings else {}
        shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items())
        cells.append((f"<code>{esc(shown or '—')}</code>", False))
    cause = esc(_cause(r))
    if r.verdict:
        # The trace's verdict line, as `show` and its own report word it.
        cause += f'<div class="said">{esc(r.verdict)}</div>'
    cells += [(status, False), (esc(_root(r)), False), (cause, False), (esc(value), True)]
    if planted:
        cells.append((esc(_planted(r)), False))
    cells += [(esc(fmt_count(r.forks)), True), (esc(f"${r.usd:,.4f}"), True)]
    cells.append((f"<code>{esc(r.tape)}</code>", False))
    tds = "".join(f'<td class="num">{c}</td>' if num else f"<td>{c}</td>" for c, num in cells)
    return f'<tr data-status="{esc(r.status)}">{tds}</tr>'


# How the page words a rank-1 cause's measure, as a trace's own report does.
_MEASURES = {"phi": "blame φ", "flip_rate": "flip-rate"}


def _root(r: TraceRow) -> str:
    """The failure's root a trace names: the input at its step and how often replacing it
    cleared the failure."""
    if r.root_step is None:
        return "—"
    clears = ""
    if r.root_value is not None:
        clears = f": replacing it clears the failure {fmt(r.root_value, 2)}"
        if r.root_lo is not None and r.root_hi is not None:
            clears += f" [{fmt(r.root_lo, 2)}, {fmt(r.root_hi, 2)}]"
    return root_label(r.root_step, r.root_intervention, r.root_tool) + clears


def _cause(r: TraceRow) -> str:
    if r.top_step is None:
        return "—"
    what = [f"step {r.top_step}" + (f" ({r.top_kind})" if r.top_kind else "")]
    what += [x for x in (r.top_tool, r.top_model if r.top_kind == "llm" else None) if x]
    if r.top_intervention:
        what.append(f"by {r.top_intervention}")
    if r.top_alone is False:
        what.append("(tied)")
    return " · ".join(what)


def _planted(r: TraceRow) -> str:
    if r.planted_step is None:
        return "—"
    kind = f"{r.planted} at " if r.planted else ""
    if r.top_step is None:
        return f"{kind}step {r.planted_step}: not attributed"
    mark = "named" if r.top_step == r.planted_step else f"missed (rank 1: step {r.top_step})"
    return f"{kind}step {r.planted_step}: {mark}"


_CSS = """
table.blame { max-width: 900px; } table.blame td.bar, table.blame th.bar { width: 40%; }
.track { position: relative; height: 14px; background: var(--soft); border-radius: 3px; }
.fill { position: absolute; left: 0; top: 0; bottom: 0; background: #9dbbe3; border-radius: 3px; }
.whisker { position: absolute; top: 6px; height: 2px; background: var(--fg); }
.reason { color: var(--muted); font-size: .8rem; max-width: 420px; overflow-wrap: anywhere; }
.said { color: var(--muted); font-size: .8rem; max-width: 560px; overflow-wrap: anywhere; }
table.traces td { font-size: .85rem; }
"""
