"""What the job's and the batch's report pages share: escaping, number formats, the budget
lines, the style sheet and the page around a body. Everything recorded goes through `esc`."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

# Spend and caps: the spend key X pairs with the budget key max_X (DESIGN.md, "The job").
_BUDGET_LINES = (
    ("forks", "forks", "{:,.0f}"),
    ("usd", "cost", "${:,.4f}"),
    ("tokens", "tokens", "{:,.0f}"),
    ("wall_s", "wall time", "{:,.1f} s"),
)


def esc(value: object) -> str:
    """`value` as HTML text (quotes too, so it is safe in an attribute)."""
    return html.escape(str(value), quote=True)


def or_dash(value: object) -> str:
    return "—" if value is None or value == "" else str(value)


def finite(value: object) -> float | None:
    """A finite number, or None for 'not measured' (None, NaN, anything not a number)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def fmt(value: object, digits: int = 3) -> str:
    number = finite(value)
    return "—" if number is None else f"{number:.{digits}f}"


def fmt_count(value: object) -> str:
    number = finite(value)
    return "—" if number is None else f"{number:,.0f}"


def budget_facts(spend: Mapping[str, Any], budget: Mapping[str, Any]) -> list[tuple[str, str]]:
    """("spent: cost", "$0.0412 of $0.5000") lines for each dimension spent or capped."""
    facts = []
    for key, name, form in _BUDGET_LINES:
        spent = finite(spend.get(key))
        cap = finite(budget.get(f"max_{key}"))
        if spent is None and cap is None:
            continue
        shown = "—" if spent is None else form.format(spent)
        shown += " of " + ("no cap" if cap is None else form.format(cap))
        facts.append((f"spent: {name}", shown))
    return facts


def facts_list(facts: list[tuple[str, str]]) -> str:
    """A `<dl class="facts">` of (name, HTML value) pairs: the names are escaped here, the
    values must be HTML already."""
    rows = "".join(f"<dt>{esc(name)}</dt><dd>{value}</dd>" for name, value in facts)
    return f'<dl class="facts">{rows}</dl>'


def page(title: str, body: str, *, css: str = "", js: str = "") -> str:
    """The whole page: `title` is plain text (escaped here), `body` HTML, `css` added to the
    shared style sheet, `js` an inline script (none if empty)."""
    script = f"<script>{js}</script>\n" if js else ""
    return _PAGE.format(title=esc(title), css=CSS + css, body=body, script=script)


CSS = """
:root { --fg: #1d1f23; --muted: #667; --line: #dde1e6; --soft: #f5f6f8; --accent: #3b6fb6; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1180px; padding: 24px 28px 64px; color: var(--fg);
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
h1 { font-size: 1.5rem; margin: 0 0 12px; } h2 { font-size: 1.2rem; margin: 32px 0 8px;
  border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 1rem; margin: 18px 0 4px; } h4 { font-size: .85rem; margin: 12px 0 4px;
  color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
code, pre, .idx { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
code { font-size: .85em; overflow-wrap: anywhere; }
pre { background: var(--soft); border: 1px solid var(--line); border-radius: 6px; margin: 0;
  padding: 8px 10px; font-size: 12.5px; max-height: 420px; overflow: auto;
  white-space: pre-wrap; overflow-wrap: anywhere; }
pre.error { border-color: #e3b3ad; background: #fdf2f1; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 3px 16px; margin: 0 0 12px; }
dl.facts dt, dl.meta dt { color: var(--muted); } dl.facts dd, dl.meta dd { margin: 0; }
dl.meta { display: flex; flex-wrap: wrap; gap: 2px 18px; margin: 0 0 4px; font-size: .88rem; }
dl.meta div { display: flex; gap: 5px; } dl.meta dt::after { content: ":"; }
.status { font-size: .8rem; padding: 2px 8px; border-radius: 10px; vertical-align: middle;
  background: #e6e8eb; } .status.ok { background: #dcf1e2; color: #1d6b36; }
.status.warn { background: #fbecd3; color: #8a5200; }
.note { color: #8a5200; } .legend { color: var(--muted); font-size: .85rem; }
header details { margin: 6px 0; } summary { cursor: pointer; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; } th { font-weight: 600; background: var(--soft); }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.top td { background: #eef4fc; } .ci { color: var(--muted); font-size: .8rem; }
.verdict { font-size: 1.05rem; font-weight: 600; margin: .4rem 0 .8rem; }
.badge { font-size: .72rem; padding: 1px 6px; border-radius: 4px; white-space: nowrap; }
"""

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{css}</style>
</head>
<body>
{body}
{script}</body>
</html>
"""
