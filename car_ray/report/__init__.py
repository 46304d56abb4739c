"""The report pages: the job's (header, charts, ranking, timeline) and the batch's (what
carries the blame across traces, and each trace linked to its own); self-contained, offline."""

from __future__ import annotations

from ._batch import render_batch_report, write_batch_report
from ._html import render_report, write_report

__all__ = ["render_batch_report", "render_report", "write_batch_report", "write_report"]
