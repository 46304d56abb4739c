"""The report page: self-contained, escaped, and rendered by a real headless Chromium."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from car_ray._canon import digest_of, sha256_hex
from car_ray.providers import OPENAI, Action, ToolCall, Usage
from car_ray.report import render_report, write_report
from car_ray.results import JobInfo
from car_ray.tape import LlmEvent, Tape, TapeHeader, TapeWriter, load_tape

from .conftest import BROWSER_TIMEOUT_S, Watched, open_page

XSS_MODEL = "<script>alert(1)</script>"
XSS_TOOL = "</script><img src=x onerror=alert(2)>"
XSS_LABEL = "<b>bold</b><img src=x onerror=alert(3)> & co"

# -- a tape whose recorded content attacks the page ----------------------------------------------


def _llm(step: int, messages: list[dict[str, Any]], action: Action, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o-mini", "messages": messages, "stream": stream}
    response = OPENAI.render_response(
        OPENAI.parse_request(body), action, Usage(40, 9), f"chatcmpl-test{step:04d}"
    )
    return {
        "type": "llm",
        "step": step,
        "provider": "openai",
        "model": "gpt-4o-mini",
        "action": action.to_json(),
        "request": {
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": {"content-type": "application/json"},
            "body": body,
            "sha256": digest_of(body),
        },
        "response": {
            "status": 200,
            "headers": {"content-type": "text/event-stream" if stream else "application/json"},
            "stream": stream,
            "body_text": response.decode(),
            "sha256": sha256_hex(response),
        },
        "usage": {"input_tokens": 40, "output_tokens": 9},
    }


def _tool(
    step: int, name: str, arguments: dict[str, Any], result: Any, effect: bool = False
) -> dict[str, Any]:
    return {
        "type": "tool",
        "step": step,
        "name": name,
        "arguments": {"args": [], "kwargs": arguments},
        "effect": effect,
        "result": result,
    }


@pytest.fixture(scope="module")
def xss_tape(tmp_path_factory: pytest.TempPathFactory) -> Tape:
    """Five steps; the model's text and a tool's result carry script and markup injections."""
    path = tmp_path_factory.mktemp("report") / "xss.tape"
    ask = [{"role": "user", "content": "Look up order A1 and answer."}]
    writer = TapeWriter(
        path,
        TapeHeader(
            agent="tests:agent", input={"ticket": XSS_MODEL}, created="2026-01-01T00:00:00Z"
        ),
    )
    writer.append_event(_llm(0, ask, Action(tool_calls=(ToolCall("lookup", {"id": "A1"}),)), False))
    writer.append_event(_tool(1, "lookup", {"id": "A1"}, {"notes": XSS_TOOL}))
    writer.append_event(_llm(2, ask, Action(text=f"Streamed: {XSS_MODEL}"), True))
    writer.append_event(_tool(3, "refund", {"id": "A1"}, XSS_TOOL, effect=True))
    writer.append_event(_llm(4, ask, Action(text=XSS_MODEL), False))
    writer.seal(result={"answer": XSS_MODEL})
    return load_tape(path)


def _attribution(tape: Tape) -> list[dict[str, Any]]:
    """Resample rows for every step (one not measured at all, one with a NaN), plus observation
    rows for the tool steps; step 1's label is an injection too."""
    rows: list[dict[str, Any]] = []
    for event in tape.steps:
        k = event.step
        flip: float | None = None if k == 3 else 0.1 + 0.2 * k
        phi = math.nan if k == 2 else 0.05 * k - 0.05
        rows.append(
            {
                "step": k,
                "step_kind": event.type,
                "label": XSS_LABEL if k == 1 else f"step {k}",
                "intervention": "resample",
                "flip_rate": flip,
                "flip_lo": None if flip is None else max(0.0, flip - 0.1),
                "flip_hi": None if flip is None else min(1.0, flip + 0.1),
                "flip_n": None if flip is None else 48,
                "phi": phi,
                "phi_lo": phi - 0.04,
                "phi_hi": phi + 0.04,
                "phi_se": 0.02,
                "necessity": 0.5,
                "necessity_lo": 0.3,
                "necessity_hi": 0.7,
                "necessity_n": 24,
                "sufficiency": None,
                "sufficiency_lo": None,
                "sufficiency_hi": None,
                "sufficiency_n": None,
                "rank": 5 - k if k != 3 else None,
            }
        )
    for event in tape.steps:
        if event.type == "tool":
            rows.append(
                {
                    "step": event.step,
                    "step_kind": "tool",
                    "label": XSS_LABEL if event.step == 1 else f"step {event.step}",
                    "intervention": "observation",
                    "flip_rate": 0.9,
                    "flip_lo": 0.8,
                    "flip_hi": 0.95,
                    "flip_n": 64,
                    "rank": 1 if event.step == 1 else 2,
                }
            )
    return rows


JOB = JobInfo.model_validate(
    {
        "job_id": "job-<i>7</i>",
        "status": "budget_exhausted",
        "ledger": {"spent": {"forks": 200, "usd": 0.0412}},
        "budget": {"max_forks": 200, "max_usd": 0.5},
        "recorded_outcome": 1.0,
        "note": XSS_TOOL,
    }
)

NO_JOB = JobInfo(job_id="j", status="running")  # a job.json with nothing else in it

# -- the page as text ----------------------------------------------------------------------------


def test_recorded_content_never_reaches_the_page_as_markup(xss_tape: Tape) -> None:
    page = render_report(tape=xss_tape, attribution=_attribution(xss_tape), job=JOB)
    for attack in ("<script>alert", "<img src=x", "<b>bold", "<i>7"):
        assert attack not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in page
    # plotly.js is inlined once, both figures are drawn, nothing is fetched from elsewhere.
    assert page.count("Plotly.newPlot(") == 2
    assert page.count("window.PlotlyConfig") == 1
    assert "<script src" not in page.lower()
    assert "<link" not in page.lower()


def test_unmeasured_values_show_as_dashes_and_no_attribution_draws_no_chart(
    xss_tape: Tape,
) -> None:
    rows = _attribution(xss_tape)
    page = render_report(tape=xss_tape, attribution=rows, job=NO_JOB)
    ranking = page[page.index('<section id="ranking">') : page.index('<section id="timeline">')]
    assert "nan" not in ranking.lower()
    (step_3,) = [r for r in ranking.split("</tr>") if 'href="#step-3"' in r and "resample" in r]
    assert step_3.count("—") == 3  # rank, flip-rate and sufficiency were not measured
    (step_2,) = [r for r in ranking.split("</tr>") if 'href="#step-2"' in r]
    assert step_2.count("—") == 2  # φ is NaN: not measured, like sufficiency
    empty = render_report(tape=xss_tape, attribution=[], job=NO_JOB)
    assert "Plotly.newPlot(" not in empty
    assert "not measured in this job" in empty
    assert empty.count('<details class="step"') == len(xss_tape.steps)


def test_write_report_writes_one_file_atomically(xss_tape: Tape, tmp_path: Path) -> None:
    out = write_report(tmp_path / "job" / "report.html", tape=xss_tape, attribution=[], job=JOB)
    assert out == tmp_path / "job" / "report.html"
    assert sorted(p.name for p in out.parent.iterdir()) == ["report.html"]
    assert out.read_text(encoding="utf-8").startswith("<!doctype html>")


# -- the page in a real browser ------------------------------------------------------------------


def _open(browser: Browser, path: Path, *, javascript: bool = True, fragment: str = "") -> Watched:
    """The job page, once its two plotly charts are drawn (when scripts run)."""
    charts = "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 2"
    return open_page(
        browser,
        path,
        javascript=javascript,
        fragment=fragment,
        ready=charts if javascript else None,
    )


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_the_page_renders_charts_steps_and_injections_as_text(
    browser: Browser, xss_tape: Tape, tmp_path: Path
) -> None:
    rows = _attribution(xss_tape)
    path = write_report(tmp_path / "report.html", tape=xss_tape, attribution=rows, job=JOB)
    watched = _open(browser, path)
    page = watched.page
    try:
        # Two plotly charts, drawn as SVG; one bar per measured (step, intervention).
        assert page.locator(".js-plotly-plot").count() == 2
        for chart, key in (("#chart-flip", "flip_rate"), ("#chart-phi", "phi")):
            assert page.locator(f"{chart} svg.main-svg").count() >= 1
            measured = [r for r in rows if r.get(key) is not None and not math.isnan(r[key])]
            assert page.locator(f"{chart} .barlayer .point").count() == len(measured)
            traces = page.evaluate(
                f"Array.from(document.querySelector('{chart}').data, t => [t.name, t.x.length])"
            )
            by_kind: dict[str, int] = {}
            for row in measured:
                by_kind[row["intervention"]] = by_kind.get(row["intervention"], 0) + 1
            assert dict(traces) == by_kind
        resample = page.evaluate(
            "document.querySelector('#chart-phi').data.find(t => t.name === 'resample').x.length"
        )
        assert resample == len(xss_tape.steps) - 1  # step 2's φ is NaN: not measured

        # A label with markup is shown as its characters on the chart's axis.
        ticks = page.locator("#chart-flip .ytick text").all_text_contents()
        assert f"1 · {XSS_LABEL}" in ticks

        # A step opens and shows its request; injections read as text, nothing was injected.
        step = page.locator("#step-0")
        assert step.get_attribute("open") is None
        step.locator("summary").click()
        assert step.get_attribute("open") is not None
        request_json = step.locator("pre.request").inner_text()
        assert json.loads(request_json)["messages"][0]["content"] == "Look up order A1 and answer."
        page.locator("#step-1 > summary").click()
        assert XSS_TOOL in page.locator("#step-1 pre").last.inner_text()
        page.locator("#step-4 > summary").click()
        assert XSS_MODEL in page.locator("#step-4").inner_text()
        page.locator("#step-2 > summary").click()
        assert f"Streamed: {XSS_MODEL}" in page.locator("#step-2 pre.text").first.inner_text()
        page.locator("#step-2 details.raw > summary").click()
        raw_sse = page.locator("#step-2 details.raw pre").inner_text()
        assert "data: [DONE]" in raw_sse and XSS_MODEL[:12] in raw_sse
        assert page.locator("#step-3 .badge.effect").count() == 1
        assert page.locator("header .status").inner_text() == "budget_exhausted"
        assert "200 of 200" in page.locator("header").inner_text()
        injected = page.evaluate(
            """() => ({
                media: document.querySelectorAll('img, iframe, object, embed').length,
                inPre: document.querySelectorAll('pre *').length,
                bold: document.querySelectorAll('b').length,
                scriptsOutsideCharts: Array.from(document.scripts)
                    .filter(s => s.closest('header, #ranking, #timeline')).length,
            })"""
        )
        assert injected == {"media": 0, "inPre": 0, "bold": 0, "scriptsOutsideCharts": 0}
        watched.assert_clean()
    finally:
        page.context.close()


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_a_recorded_run_reads_with_and_without_javascript(
    browser: Browser, support_tape: Tape, tmp_path: Path
) -> None:
    steps = support_tape.steps
    rows = [
        {"step": e.step, "step_kind": e.type, "label": None, "intervention": "resample",
         "flip_rate": 0.5, "flip_lo": 0.4, "flip_hi": 0.6, "flip_n": 30, "phi": 0.1,
         "phi_lo": 0.0, "phi_hi": 0.2, "phi_se": 0.05, "rank": e.step + 1}
        for e in steps
    ]  # fmt: skip
    job = JobInfo.model_validate(
        {
            "job_id": "support",
            "status": "complete",
            "notes": ["the negative control reproduced the recorded outcome"],
            "budget": {"max_forks": 200, "max_usd": None, "max_tokens": None, "max_wall_s": None},
            "ledger": {"spent": {"forks": 180, "usd": 0.0, "tokens": 5000}},
            "wall_s": 12.5,
        }
    )
    path = write_report(tmp_path / "report.html", tape=support_tape, attribution=rows, job=job)

    watched = _open(browser, path, fragment="#step-3")
    try:
        page = watched.page
        assert page.locator("details.step").count() == len(steps)
        # Arriving on a step's address opens it; the ranked table links to the steps.
        assert page.locator("#step-3").get_attribute("open") is not None
        assert page.locator("#ranking a[href='#step-0']").count() == 1
        header = page.locator("header").inner_text()
        assert "180 of 200" in header and "12.5 s of no cap" in header
        assert "agent returned" in header and "negative control reproduced" in header
        bars = page.evaluate("document.querySelector('#chart-flip').data[0].x.length")
        assert bars == len(steps)
        watched.assert_clean()
    finally:
        watched.page.context.close()

    watched = _open(browser, path, javascript=False)
    try:
        page = watched.page
        first_llm = next(e for e in steps if isinstance(e, LlmEvent))
        step = page.locator(f"#step-{first_llm.step}")
        step.locator("summary").click()
        assert step.get_attribute("open") is not None
        assert '"messages"' in step.locator("pre.request").inner_text()
        watched.assert_clean()
    finally:
        watched.page.context.close()
