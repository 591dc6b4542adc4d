"""``partita analyze TRACE...``: the breakdown of profiler traces Partita did not record
(torch.profiler / Kineto / torch_npu Chrome traces from Megatron, torchtitan, DeepSpeed...;
issue 14 item 3; torch_npu capture folders read as msprof reads them, issue 35). The analysis is :mod:`partita.analyze.ranks`; this module parses the
command line and prints (rich tables, ``--json``, ``--report page.html``)."""
from __future__ import annotations

import argparse
import json

from ..analyze.files import DEFAULT_MAX_MB
from .types import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("analyze", help="analyse torch.profiler / Kineto traces from any framework (per rank: "
                                       "compute, communication, overlap, idle, stragglers, memory)")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="Chrome trace files (.json / .json.gz), one per rank, or directories of them; torch_npu: "
                        "a cluster directory of *_ascend_pt folders, one *_ascend_pt folder or its "
                        "ASCEND_PROFILER_OUTPUT")
    p.add_argument("--conventions", choices=("partita", "hta"), default="partita",
                   help="partita: every profiled step, window to the last device event (default); hta: Holistic "
                        "Trace Analysis 0.5.0's definitions (last step dropped, timestamps rounded; see "
                        "docs/profile.md)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--report", help="also write a self-contained HTML page (needs plotly: partita[report])")
    p.add_argument("--max-mb", type=positive_int(1 << 20), default=DEFAULT_MAX_MB,
                   help=f"refuse traces holding more JSON text than this together (MB, decompressed; default "
                        f"{DEFAULT_MAX_MB}: bounds the time and memory of the analysis)")
    p.set_defaults(func=cmd_analyze)


def cmd_analyze(args: argparse.Namespace) -> int:
    from ..analyze.ranks import analyze_traces
    if args.report:
        from ..report.html_page import require_plotly
        require_plotly()
    report, timelines = analyze_traces(args.traces, args.conventions, args.max_mb)
    if args.report:
        from ..analyze.report import write_analyze_report
        report["html_report"] = str(write_analyze_report(report, timelines, args.report))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_analysis(report)
    return 0


def _ms(us: float) -> str:
    return f"{us / 1e3:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def rank_table(report: dict):
    """One row per rank: the temporal breakdown and the communication split."""
    from rich.table import Table
    table = Table(title=f"Per rank ({report['conventions']} conventions; % of the window)", title_justify="left")
    for name in ("rank", "window ms", "compute %", "non-compute %", "idle %", "comm ms", "overlap % of comm",
                 "exposed comm ms", "by collective (ms)", "by axis (ms)"):
        table.add_column(name, justify="left" if name.startswith("by") else "right")
    for r in report["ranks"]:
        table.add_row(str(r["rank"]), _ms(r["window_us"]), _pct(r["compute_pct"]), _pct(r["non_compute_pct"]),
                      _pct(r["idle_pct"]), _ms(r["communication_us"]), _pct(r["overlap_pct"]),
                      _ms(r["exposed_communication_us"]),
                      ", ".join(f"{k} {_ms(v)}" for k, v in r["by_collective_us"].items()) or "-",
                      ", ".join(f"{k} {_ms(v)}" for k, v in r["by_axis_us"].items()) or "-")
    return table


def msprof_table(report: dict):
    """torch_npu captures: Partita's figures per rank and step beside msprof's own
    ``step_trace_time.csv`` (ms), or None when no rank has one."""
    from rich.table import Table
    rows = []
    for r in report["ranks"]:
        ours = {p["step"]: p for p in (r.get("ascend") or {}).get("per_step", [])}
        for theirs in (r.get("msprof") or {}).get("step_trace_time", []):
            mine = ours.get(theirs["step"]) or (next(iter(ours.values())) if len(ours) == 1 else None)
            if mine:
                rows.append((r["rank"], theirs["step"], mine, theirs))
    if not rows:
        return None
    table = Table(title="Per rank and step: Partita / msprof step_trace_time.csv (ms)", title_justify="left")
    keys = (("step", "window_us"), ("computing", "computing_us"), ("comm not overlapped", "communication_not_overlapped_us"),
            ("overlapped", "overlapped_us"), ("free", "free_us"))
    for name in ("rank", "step", *(k for k, _ in keys)):
        table.add_column(name, justify="right")
    for rank, step, mine, theirs in rows:
        table.add_row(str(rank), str(step), *(f"{_ms(mine[k])} / {_ms(theirs[k])}" if theirs.get(k) is not None
                                              else _ms(mine[k]) for _, k in keys))
    return table


def memory_table(report: dict):
    """Peaks and fragmentation per rank and device, or None without memory events."""
    from rich.table import Table
    rows = [(r["rank"], dev, m) for r in report["ranks"] for dev, m in r["memory"].items()]
    if not rows:
        return None
    table = Table(title="Memory (\\[memory] events, or torch_npu's memory_record.csv)", title_justify="left")
    for name in ("rank", "device", "peak allocated GiB", "peak reserved GiB", "fragmentation at peak"):
        table.add_column(name, justify="right")
    for rank, dev, m in rows:
        frag = m["fragmentation_at_peak_reserved"]
        table.add_row(str(rank), dev, f"{m['peak_allocated_bytes'] / 2**30:.2f}",
                      f"{m['peak_reserved_bytes'] / 2**30:.2f}", "-" if frag is None else f"{frag:.1%}")
    return table


def print_analysis(report: dict) -> None:
    from .render import make_console
    console = make_console()
    console.print(rank_table(report))
    msprof = msprof_table(report)
    if msprof is not None:
        console.print(msprof)
    s = report["stragglers"]
    if len(report["ranks"]) > 1 and s:
        c = s["compute"]
        console.print(f"Stragglers: rank {s['straggler']['rank']} ({s['straggler']['signal']}); rank {c['rank']} "
                      f"computes most, {_ms(c['us'])} ms, {c['ratio_to_median']:.3f}x the median rank")
    mem = memory_table(report)
    if mem is not None:
        console.print(mem)
    else:
        console.print("Memory: no \\[memory] events (record with torch.profiler's profile_memory=True)")
    if report.get("html_report"):
        console.print(f"HTML report: {report['html_report']}")
