"""The plan report: ``partita plan --report plan.html`` and ``partita estimate --report
est.html`` write one self-contained page (plotly.js inline, opens offline) with the top
plans side by side, memory per rank for every pipeline stage, where the step time goes,
the predicted schedule of one step, scaling with the number of devices, and the "why not"
alternatives with their full layouts. Planning-side: no torch; plotly is the optional
``report`` extra, imported only when a page is written."""
from __future__ import annotations

from .page import build_report, check_report_path, write_report

__all__ = ["build_report", "check_report_path", "write_report"]
