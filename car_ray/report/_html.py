"""The job's report: one self-contained HTML page that works offline.

Everything recorded (bodies, tool results, labels, the job) is HTML-escaped before it reaches
the page. The charts are plotly figures whose JSON plotly writes with `<`, `>` and `/` as
`\\u003c`-style escapes, so recorded text cannot close their `<script>`; the strings handed to
plotly are HTML-escaped as well, because plotly.js reads a few HTML tags in text (`<a>`, `<b>`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.io as pio  # type: ignore[import-untyped]

from ..providers import codec_for, codec_for_path
from ..results import JobInfo, verdict
from ..results._output import write_whole
from ..tape import LlmEvent, Tape, ToolEvent
from ._page import budget_facts, esc, facts_list, finite, fmt, fmt_count, or_dash, page

Row = Mapping[str, Any]

# Fixed colours per intervention kind, so one kind looks the same in every chart.
_KIND_COLOURS = {
    "resample": "#3b6fb6",
    "observation": "#d9822b",
    "action": "#3a9a5b",
    "context": "#c0392b",
    "policy": "#7d5ba6",
}
_MORE_COLOURS = ("#5b8e7d", "#b0772f", "#8c6d8a", "#4f7cac")
_PLOTLY_CONFIG = {
    "displaylogo": False,
    "responsive": True,
    "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"],
}
_PREVIEW_CHARS = 100
# An attribution row names a measure's bounds and count by a prefix: flip_rate -> flip_lo.
_BOUNDS_PREFIX = {
    "flip_rate": "flip",
    "phi": "phi",
    "necessity": "necessity",
    "sufficiency": "sufficiency",
}


def write_report(path: Path, *, tape: Tape, attribution: Sequence[Row], job: JobInfo) -> Path:
    """Write the report page to `path` (via a temporary name, then renamed) and return it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    html = render_report(tape=tape, attribution=attribution, job=job)
    write_whole(path, html, sync=False)
    return path


def render_report(*, tape: Tape, attribution: Sequence[Row], job: JobInfo) -> str:
    """The report page as one HTML string.

    From `job` (job.json): `job_id`, `status`, `notes`, `budget`, the spend in
    `ledger.spent` with `wall_s`, and `recorded_outcome` (the scorer's value on the tape;
    else the agent's recorded result is shown). The whole of it is shown as JSON too.
    `attribution` rows: one per step and intervention kind (flip-rate, φ, necessity,
    sufficiency with bounds and counts, rank); a value that is None or NaN was not measured.
    """
    job_id = or_dash(job.job_id)
    labels = _step_labels(tape, attribution)
    body = "\n".join(
        [
            _header(tape, job, attribution),
            _charts(attribution, labels),
            _ranked_table(attribution, labels),
            _timeline(tape, attribution),
        ]
    )
    return page(f"car-ray report · {job_id}", body, css=_CSS, js=_JS)


# -- values -------------------------------------------------------------------------------------


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _one_line(text: str, limit: int = _PREVIEW_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _pre(text: str, cls: str = "json") -> str:
    return f'<pre class="{cls}">{esc(text)}</pre>'


# -- header -------------------------------------------------------------------------------------


def _header(tape: Tape, job: JobInfo, attribution: Sequence[Row]) -> str:
    status = or_dash(job.status)
    status_class = {"complete": "ok", "budget_exhausted": "warn"}.get(status, "other")
    facts = [
        ("job", f"<code>{esc(or_dash(job.job_id))}</code>"),
        ("tape", f"<code>{esc(tape.tape_id)}</code>" + ("" if tape.sealed else " (incomplete)")),
        ("agent", f"<code>{esc(tape.header.agent)}</code>"),
        ("recorded", esc(tape.header.created)),
        ("steps", esc(len(tape.steps))),
        ("recorded outcome", esc(_recorded_outcome(tape, job))),
    ]
    spend = {"wall_s": job.wall_s, **(job.ledger.spent.model_dump() if job.ledger else {})}
    budget = job.budget.model_dump() if job.budget else {}
    facts += [(name, esc(shown)) for name, shown in budget_facts(spend, budget)]
    notes = [*tape.notes, *(n.text for n in job.notes)]
    notes_html = "".join(f'<p class="note">{esc(note)}</p>' for note in notes)
    result = _seal_result(tape)
    # The same line the command line ends with, from the rows and the tape.
    line = verdict(attribution, tape, job.status, job.notes, job.answer)
    verdict_html = f'<p class="verdict">{esc(line)}</p>' if attribution else ""
    return f"""<header>
<h1>car-ray report <span class="status {status_class}">{esc(status)}</span></h1>
{verdict_html}{facts_list(facts)}
{notes_html}
<details><summary>input and the agent's result</summary>
<h4>input</h4>{_pre(_pretty(tape.header.input))}
<h4>result</h4>{result}
</details>
<details><summary>job (as recorded in job.json)</summary>{_pre(job.to_json())}</details>
</header>"""


def _recorded_outcome(tape: Tape, job: JobInfo) -> str:
    score = finite(job.recorded_outcome)
    if score is not None:
        return f"{score:.3f} (scorer; 1 = the bad outcome)"
    if tape.seal is None:
        return "— (the recording was cut off)"
    if tape.seal.error is not None:
        return _one_line(f"agent raised {tape.seal.error.type}: {tape.seal.error.message}")
    return _one_line(
        "agent returned " + json.dumps(tape.seal.result, ensure_ascii=False, default=str)
    )


def _seal_result(tape: Tape) -> str:
    if tape.seal is None:
        return '<p class="note">no seal: the recording was cut off</p>'
    if tape.seal.error is not None:
        return _pre(f"{tape.seal.error.type}: {tape.seal.error.message}", "text error")
    return _pre(_pretty(tape.seal.result))


# -- charts -------------------------------------------------------------------------------------


def _step_labels(tape: Tape, attribution: Sequence[Row]) -> dict[int, str]:
    """One unique label per step: its number, then the row's label or the tape's description."""
    described: dict[int, str] = {}
    for event in tape.steps:
        if isinstance(event, LlmEvent):
            described[event.step] = f"llm {event.model}"
        else:
            described[event.step] = f"tool {event.name}"
    for row in attribution:
        step = _step_of(row)
        if step is not None and row.get("label"):
            described[step] = str(row["label"])
    return {step: f"{step} · {label}" for step, label in sorted(described.items())}


def _step_of(row: Row) -> int | None:
    number = finite(row.get("step"))
    return None if number is None else int(number)


def _kinds(attribution: Sequence[Row]) -> list[str]:
    return list(dict.fromkeys(str(row.get("intervention")) for row in attribution))


def _colour(kind: str, kinds: list[str]) -> str:
    if kind in _KIND_COLOURS:
        return _KIND_COLOURS[kind]
    return _MORE_COLOURS[kinds.index(kind) % len(_MORE_COLOURS)]


def _charts(attribution: Sequence[Row], labels: dict[int, str]) -> str:
    charts = (
        ("flip", "flip_rate", "Flip-rate per step", "P(outcome flips | intervene on the step)"),
        ("phi", "phi", "φ (Shapley blame) per step", "φ: + pushed toward the bad outcome"),
    )
    parts = ['<section id="charts"><h2>Per-step effects</h2>']
    plotly_js_included = False
    for name, key, title, axis in charts:
        figure = _bar_figure(attribution, labels, key, axis)
        parts.append(f"<h3>{esc(title)}</h3>")
        if figure is None:
            parts.append('<p class="note">not measured in this job</p>')
            continue
        parts.append(
            '<div class="chart">'
            + str(
                pio.to_html(
                    figure,
                    include_plotlyjs=not plotly_js_included,
                    full_html=False,
                    div_id=f"chart-{name}",
                    config=_PLOTLY_CONFIG,
                    default_height=f"{figure['layout']['height']}px",
                    validate=True,
                )
            )
            + "</div>"
        )
        plotly_js_included = True
    parts.append(
        '<p class="legend">Bars are point estimates; whiskers are the intervals '
        "(missing whiskers or bars: not measured).</p></section>"
    )
    return "\n".join(parts)


def _bar_figure(
    attribution: Sequence[Row], labels: dict[int, str], key: str, axis_title: str
) -> dict[str, Any] | None:
    """Horizontal bars, one trace per intervention kind, steps top to bottom in tape order."""
    kinds = _kinds(attribution)
    traces: list[dict[str, Any]] = []
    for kind in kinds:
        ys: list[str] = []
        xs: list[float] = []
        above: list[float | None] = []
        below: list[float | None] = []
        hover: list[list[str]] = []
        for row in attribution:
            step, value = _step_of(row), finite(row.get(key))
            if str(row.get("intervention")) != kind or step is None or value is None:
                continue
            bounds = _BOUNDS_PREFIX[key]
            low, high = finite(row.get(f"{bounds}_lo")), finite(row.get(f"{bounds}_hi"))
            count = row.get("phi_se") if key == "phi" else row.get(f"{bounds}_n")
            ys.append(esc(labels.get(step, str(step))))
            xs.append(value)
            above.append(None if high is None else max(high - value, 0.0))
            below.append(None if low is None else max(value - low, 0.0))
            hover.append([fmt(low), fmt(high), fmt(count) if key == "phi" else fmt_count(count)])
        if not xs:
            continue
        extra = "se" if key == "phi" else "n"
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": esc(kind),
                "x": xs,
                "y": ys,
                "marker": {"color": _colour(kind, kinds)},
                "error_x": {
                    "type": "data",
                    "symmetric": False,
                    "array": above,
                    "arrayminus": below,
                    "color": "#333",
                    "thickness": 1.2,
                    "width": 3,
                },
                "customdata": hover,
                "hovertemplate": (
                    "%{y}<br>%{x:.3f} [%{customdata[0]}, %{customdata[1]}]"
                    f"<br>{extra} = %{{customdata[2]}}<extra>%{{fullData.name}}</extra>"
                ),
            }
        )
    if not traces:
        return None
    categories = [esc(label) for label in labels.values()]
    height = 110 + len(categories) * (14 + 12 * len(traces))
    return {
        "data": traces,
        "layout": {
            "template": "plotly_white",
            "barmode": "group",
            "height": height,
            "margin": {"l": 10, "r": 20, "t": 10, "b": 50},
            "font": {"family": "system-ui, sans-serif", "size": 13, "color": "#222"},
            "legend": {"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom"},
            "xaxis": {
                "title": {"text": esc(axis_title)},
                "zeroline": True,
                "zerolinecolor": "#888",
                **({"range": [0, 1.02]} if key == "flip_rate" else {}),
            },
            "yaxis": {
                "type": "category",
                "categoryorder": "array",
                "categoryarray": categories,
                "range": [len(categories) - 0.5, -0.5],
                "automargin": True,
                "ticklabelstandoff": 6,
            },
        },
    }


# -- ranked table -------------------------------------------------------------------------------


def _ranked_table(attribution: Sequence[Row], labels: dict[int, str]) -> str:
    if not attribution:
        return '<section id="ranking"><h2>Ranking</h2><p class="note">no attribution</p></section>'
    kinds = _kinds(attribution)

    def order(row: Row) -> tuple[int, float, int]:
        rank = finite(row.get("rank"))
        return (
            kinds.index(str(row.get("intervention"))),
            math.inf if rank is None else rank,
            _step_of(row) or 0,
        )

    body = []
    for row in sorted(attribution, key=order):
        step = _step_of(row)
        rank = finite(row.get("rank"))
        top = ' class="top"' if rank == 1 else ""
        step_cell = "—" if step is None else f'<a href="#step-{step}">{step}</a>'
        label = labels.get(step, "") if step is not None else ""
        label = label.split(" · ", 1)[-1] if label else or_dash(row.get("label"))
        body.append(
            f"<tr{top}><td class=num>{esc(fmt_count(rank))}</td><td class=num>{step_cell}</td>"
            f"<td>{esc(or_dash(row.get('step_kind')))}</td><td>{esc(label)}</td>"
            f"<td>{esc(or_dash(row.get('intervention')))}</td>"
            + _measure(row, "flip_rate", "n")
            + _measure(row, "phi", "se")
            + _measure(row, "necessity", "n")
            + _measure(row, "sufficiency", "n")
            + "</tr>"
        )
    return f"""<section id="ranking"><h2>Ranking</h2>
<table><thead><tr><th class="num">rank</th><th class="num">step</th><th>kind</th><th>label</th>
<th>intervention</th><th class="num">flip-rate</th><th class="num">φ</th>
<th class="num">necessity</th><th class="num">sufficiency</th></tr></thead>
<tbody>{"".join(body)}</tbody></table>
<p class="legend">Intervals in brackets; n = forks measured, se = standard error of φ;
— = not measured. Necessity: P(the failure disappears | resample this step alone);
sufficiency: P(the failure stays | pin this step alone, resample the rest).</p></section>"""


def _measure(row: Row, key: str, extra: str) -> str:
    value = fmt(row.get(key))
    if value == "—":
        return '<td class="num">—</td>'
    bounds = _BOUNDS_PREFIX[key]
    low, high = fmt(row.get(f"{bounds}_lo")), fmt(row.get(f"{bounds}_hi"))
    more = fmt(row.get("phi_se")) if extra == "se" else fmt_count(row.get(f"{bounds}_n"))
    return (
        f'<td class="num">{esc(value)}<br><span class="ci">[{esc(low)}, {esc(high)}] '
        f"{extra}={esc(more)}</span></td>"
    )


# -- timeline -----------------------------------------------------------------------------------


def _timeline(tape: Tape, attribution: Sequence[Row]) -> str:
    top: dict[int, list[str]] = {}
    for row in attribution:
        step = _step_of(row)
        if step is not None and finite(row.get("rank")) == 1:
            top.setdefault(step, []).append(str(row.get("intervention")))
    steps = "\n".join(
        _llm_step(event, top.get(event.step, []))
        if isinstance(event, LlmEvent)
        else _tool_step(event, top.get(event.step, []))
        for event in tape.steps
    )
    return f"""<section id="timeline"><h2>Timeline</h2>
<p class="legend">Each step opens to show what was sent and received, as recorded.</p>
{steps}</section>"""


def _badges(top_for: list[str]) -> str:
    return "".join(f'<span class="badge top">top cause · {esc(kind)}</span>' for kind in top_for)


def _reply(event: LlmEvent) -> dict[str, Any] | None:
    """What the model did: reassembled from the response body (JSON or SSE) by its codec."""
    try:
        codec = codec_for_path(event.request.path) or codec_for(event.provider)
        action, _usage = codec.parse_response(event.response.body_bytes, event.response.stream)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return event.action
    return action.to_json()


def _reply_preview(reply: dict[str, Any] | None) -> str:
    if reply is None:
        return "(unreadable response)"
    calls = ", ".join(str(c.get("name")) for c in reply.get("tool_calls") or [])
    text = str(reply.get("text") or "")
    return (f"→ {calls}  " if calls else "") + text


def _llm_step(event: LlmEvent, top_for: list[str]) -> str:
    reply = _reply(event)
    response = event.response
    meta = [
        ("provider", event.provider),
        ("model", event.model),
        ("HTTP", f"{event.request.method} {event.request.path} → {response.status}"),
        ("streamed", "yes (SSE)" if response.stream else "no"),
        (
            "tokens in / out",
            f"{event.usage.get('input_tokens', '—')} / {event.usage.get('output_tokens', '—')}",
        ),
        ("latency", f"{event.latency_s:.3f} s"),
        ("retries", str(event.retries)),
    ]
    parts = [_meta(meta)]
    if reply is not None:
        parts.append(
            "<h4>reply, reassembled from the SSE stream</h4>"
            if response.stream
            else "<h4>reply</h4>"
        )
        if reply.get("text"):
            parts.append(_pre(str(reply["text"]), "text"))
        if reply.get("tool_calls"):
            parts.append(_pre(_pretty(reply["tool_calls"])))
    parts.append("<h4>request body</h4>" + _pre(_pretty(event.request.body), "json request"))
    if response.body_text is None:
        raw = f"(binary body, base64)\n{response.body_b64 or ''}"
        parts.append("<h4>response body</h4>" + _pre(raw, "text"))
    elif response.stream:
        parts.append(
            '<details class="raw"><summary>raw SSE response body</summary>'
            + _pre(response.body_text, "text")
            + "</details>"
        )
    else:
        parts.append("<h4>response body</h4>" + _pre(_json_or_text(response.body_text)))
    summary = (
        f'<span class="idx">{event.step}</span><span class="kind llm">llm</span>'
        f'<span class="who">{esc(event.provider)} · {esc(event.model)}</span>'
        f'{_badges(top_for)}<span class="preview">{esc(_one_line(_reply_preview(reply)))}</span>'
    )
    return _step(event.step, summary, "".join(parts))


def _tool_step(event: ToolEvent, top_for: list[str]) -> str:
    if event.error is not None:
        outcome = f"{event.error.type}: {event.error.message}"
        shown = "<h4>error</h4>" + _pre(outcome, "text error")
    else:
        outcome = event.result if isinstance(event.result, str) else _pretty(event.result)
        kind = "text" if isinstance(event.result, str) else "json"
        shown = "<h4>result</h4>" + _pre(outcome, kind)
    meta = [
        ("tool", event.name),
        ("effect", "yes: never re-run in replay or a fork's tail" if event.effect else "no"),
        ("latency", f"{event.latency_s:.3f} s"),
    ]
    flags = '<span class="badge effect">effect</span>' if event.effect else ""
    flags += '<span class="badge error">error</span>' if event.error is not None else ""
    summary = (
        f'<span class="idx">{event.step}</span><span class="kind tool">tool</span>'
        f'<span class="who">{esc(event.name)}</span>{flags}{_badges(top_for)}'
        f'<span class="preview">{esc(_one_line(outcome))}</span>'
    )
    body = _meta(meta) + "<h4>arguments</h4>" + _pre(_pretty(event.arguments)) + shown
    return _step(event.step, summary, body)


def _json_or_text(text: str) -> str:
    try:
        return _pretty(json.loads(text))
    except ValueError:
        return text


def _meta(items: list[tuple[str, str]]) -> str:
    cells = "".join(
        f"<div><dt>{esc(name)}</dt><dd>{esc(value)}</dd></div>" for name, value in items
    )
    return f'<dl class="meta">{cells}</dl>'


def _step(step: int, summary: str, body: str) -> str:
    return (
        f'<details class="step" id="step-{step}"><summary>{summary}</summary>'
        f'<div class="body">{body}</div></details>'
    )


# -- page ---------------------------------------------------------------------------------------

# The job page's own rules, added to the shared style sheet (`_page.CSS`).
_CSS = """
details.step { border: 1px solid var(--line); border-radius: 6px; margin: 6px 0; }
details.step > summary { padding: 6px 10px; display: flex; gap: 10px; align-items: baseline;
  list-style-position: inside; } details.step[open] > summary { background: var(--soft);
  border-bottom: 1px solid var(--line); }
details.step:target { outline: 2px solid var(--accent); }
.body { padding: 6px 12px 12px; } .idx { color: var(--muted); min-width: 2ch; text-align: right; }
.kind { font-size: .75rem; padding: 1px 6px; border-radius: 4px; background: #e8eefb; }
.kind.tool { background: #fbeee0; } .who { font-weight: 600; white-space: nowrap; }
.preview { color: var(--muted); overflow: hidden; text-overflow: ellipsis; white-space: nowrap;
  min-width: 0; flex: 1; }
.badge.effect { background: #fde2e0; color: #9b2c20; } .badge.error { background: #c0392b;
  color: #fff; } .badge.top { background: var(--accent); color: #fff; }
details.raw { margin-top: 10px; }
.chart { border: 1px solid var(--line); border-radius: 6px; padding: 4px; }
"""

# Opening a step from a link (the ranked table) or the address bar: the page reads without it.
_JS = """
function openTarget() {
  var el = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  if (el && el.tagName === "DETAILS") { el.open = true; }
}
window.addEventListener("hashchange", openTarget);
openTarget();
"""
