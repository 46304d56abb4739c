"""The job's report: one self-contained, offline HTML page (header, charts, ranking, timeline)."""

from __future__ import annotations

from ._html import render_report, write_report

__all__ = ["render_report", "write_report"]
