"""The batch's report page in headless Chromium: what carries the blame (counts and intervals
from summary rows counted by hand), every trace with its rank-1 cause, a link to a trace's
own report only where that report exists, and recorded text shown as text, never markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from car_ray.report import render_batch_report, write_batch_report
from car_ray.results import BatchInfo, Caps, Spend, TraceRow, summarize

from .conftest import BROWSER_TIMEOUT_S, open_page

HOSTILE = '<img src=x onerror="alert(1)">[bold red]boom[/]</td></table><script>alert(2)</script>'


# A trace's verdict line, as its job wrote it (recorded text in it is text on the page too).
VERDICT = (
    f"verdict: the tool result at step 1 (lookup_order returned {HOSTILE}) is the root: "
    "replacing it clears the failure 100% of the time [0.90, 1.00]; the agent went wrong at "
    "step 3 (blame φ 0.80 [0.70, 0.90]) at 95% confidence"
)


def _rows() -> list[TraceRow]:
    """Four traces: two name their planted step, one misses it, one is corrupt; recorded
    text (a tool name, a tape path, a reason) carries markup."""
    common = {"forks": 20, "usd": 0.0012, "top_kind": "tool", "top_intervention": "observation"}
    return [
        TraceRow(
            trace="aaaa", tape="nt/a.tape", folder="trace=aaaa", status="complete",
            top_step=1, top_tool="lookup_order", top_measure="phi", top_value=0.8,
            top_lo=0.7, top_hi=0.9, top_alone=True, planted="injected_note", planted_step=1,
            root_step=1, root_intervention="observation", root_tool="lookup_order",
            root_value=1.0, root_lo=0.9, root_hi=1.0, verdict=VERDICT, **common,
        ),
        TraceRow(
            trace="bbbb", tape=f"nt/{HOSTILE}.tape", folder="trace=bbbb", status="complete",
            top_step=1, top_tool=HOSTILE, top_measure="phi", top_value=0.6, top_lo=0.4,
            top_hi=0.8, top_alone=True, planted="injected_note", planted_step=1, **common,
        ),
        TraceRow(
            trace="cccc", tape="nt/c.tape", folder="trace=cccc", status="budget_exhausted",
            top_step=3, top_tool="decide", top_measure="phi", top_value=0.5, top_lo=0.1,
            top_hi=0.9, top_alone=False, planted="wrong_policy", planted_step=2, **common,
        ),
        TraceRow(
            trace="dddd", tape="nt/d.tape", folder="trace=dddd", status="corrupt",
            reason=f"line 3: not JSON {HOSTILE}", planted="corrupt",
        ),
    ]  # fmt: skip


def _info(kind: str = "batch") -> BatchInfo:
    return BatchInfo(
        batch_id="nightly-batch-0123456789ab",
        kind=kind,  # type: ignore[arg-type]
        status="complete",
        job_file="jobs/nightly/job.toml",
        budget=Caps(max_usd=1.0),
        spent=Spend(forks=60, usd=0.0036, tokens=1200),
        runs=1,
        wall_s=12.5,
        busy_share=0.9,
        notes=[f"a note with {HOSTILE}"],
    )


@pytest.mark.timeout(BROWSER_TIMEOUT_S)
def test_the_batch_page_shows_the_blame_every_trace_and_recorded_text_as_text(
    browser: Browser, tmp_path: Path
) -> None:
    rows = _rows()
    summary = summarize([r.model_dump() for r in rows], 0.95)
    info = _info()
    folder = tmp_path / info.batch_id
    (folder / "trace=aaaa").mkdir(parents=True)
    (folder / "trace=aaaa" / "report.html").write_text("<title>trace aaaa</title>")
    (folder / "trace=cccc").mkdir()  # a trace folder with no report: no link
    path = Path(write_batch_report(str(tmp_path), info, rows, summary))
    assert path == folder / "report.html"

    watched = open_page(browser, path)
    watched.assert_clean()  # no script ran (no dialog), nothing fetched from outside
    page = watched.page
    assert page.locator("script").count() == 0 and page.locator("img").count() == 0
    assert page.locator("h1").inner_text().split() == ["car-ray", "batch", "complete"]
    # 3 of the 4 traces have a rank-1 cause; two of three planted steps are rank 1.
    assert page.locator(".verdict").inner_text() == (
        "3 of 4 traces have a rank-1 cause, 1 of them a root; the planted step is rank 1 in 2 of 3"
    )

    # The blame: steps counted over the 3 attributed traces, statuses over all 4.
    def table(dimension: str) -> list[list[str]]:
        cells = page.locator(f'table[data-dimension="{dimension}"] tbody tr')
        return [[c.strip() for c in r.split("\t")][:2] for r in cells.all_inner_texts()]

    assert table("root") == [["step 1 (lookup_order result)", "1 of 3"]]
    assert table("step") == [["step 1 (tool)", "2 of 3"], ["step 3 (tool)", "1 of 3"]]
    assert table("status") == [
        ["complete", "2 of 4"],
        ["budget_exhausted", "1 of 4"],
        ["corrupt", "1 of 4"],
    ]
    assert [HOSTILE, "1 of 3"] in table("tool")  # a recorded tool name, as text

    # Every trace is a row; only the trace whose folder holds a report.html links to it.
    assert page.locator("table.traces tbody tr").count() == 4
    links = page.locator("table.traces a")
    assert links.count() == 1 and links.get_attribute("href") == "trace%3Daaaa/report.html"
    links.click()
    assert page.title() == "trace aaaa"
    page.go_back()

    traces = page.locator("table.traces").inner_text()
    # The root a trace names, and its verdict line word for word, as `show` prints it.
    first = page.locator("table.traces tbody tr").first.inner_text()
    assert "step 1 (lookup_order result): replacing it clears the failure 1.00" in first
    assert VERDICT in first and "blame φ 0.80 [0.70, 0.90]" in first
    assert "injected_note at step 1: named" in traces
    assert "wrong_policy at step 2: missed (rank 1: step 3)" in traces
    assert f"line 3: not JSON {HOSTILE}" in traces
    assert f"nt/{HOSTILE}.tape" in traces
    assert f"a note with {HOSTILE}" in page.locator("header").inner_text()


def test_a_sweep_page_compares_cells_by_their_settings() -> None:
    rows = [
        TraceRow(
            trace=name, tape="t.tape", folder=f"cell={name}", status="complete", top_step=1,
            settings=json.dumps({"confidence": conf, "method": "<b>auto</b>"}),
        )
        for name, conf in (("c1", 0.9), ("c2", 0.95))
    ]  # fmt: skip
    html = render_batch_report(_info("sweep"), rows, summarize([r.model_dump() for r in rows]))
    assert "<h2>Cells compared</h2>" in html and "<th>settings</th>" in html
    for conf in (0.9, 0.95):
        assert f"confidence={conf}, method=&quot;&lt;b&gt;auto&lt;/b&gt;&quot;" in html
    assert "<b>auto</b>" not in html and "<a href" not in html  # no report given: no link


def test_an_empty_batch_says_nothing_is_attributed() -> None:
    html = render_batch_report(_info(), [], [])
    assert "No traces have a rank-1 cause yet." in html
    assert "0 of 0 traces have a rank-1 cause" in html
