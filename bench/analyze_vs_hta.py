"""``partita analyze`` beside Holistic Trace Analysis 0.5.0 on the three real GPU traces in
tests/data/traces: HTA's own temporal breakdown and overlap, ``--conventions hta`` and the
default conventions, side by side (percentages of each one's window).

    pip install --no-deps HolisticTraceAnalysis==0.5.0    # its imports are in the test extra
    python bench/analyze_vs_hta.py
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from partita.analyze.ranks import analyze_traces

TRACES = Path(__file__).resolve().parents[1] / "tests" / "data" / "traces"
RUNS = {"ddp": ["ddp_2gpu_rank0"], "a2a": ["a2a_128gpu_rank0", "a2a_128gpu_rank1"]}


def hta_figures(names: list[str]) -> dict[int, tuple]:
    """rank -> (window us, compute %, non-compute %, idle %, overlap %) from HTA itself."""
    from hta.trace_analysis import TraceAnalysis
    with tempfile.TemporaryDirectory() as d:
        for n in names:
            shutil.copy(TRACES / f"{n}.json.gz", d)
        ta = TraceAnalysis(trace_dir=d)
        t = ta.get_temporal_breakdown(visualize=False).set_index("rank")
        o = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    return {r: (t.loc[r, "kernel_time(us)"], t.loc[r, "compute_time_pctg"], t.loc[r, "non_compute_time_pctg"],
                t.loc[r, "idle_time_pctg"], o.loc[r, "comp_comm_overlap_pctg"]) for r in t.index}


def main() -> None:
    print(f"{'run':4} {'rank':>4} {'source':17} {'window ms':>10} {'compute%':>9} {'non-comp%':>9} {'idle%':>7} "
          f"{'overlap%':>9}")
    worst = 0.0
    for run, names in RUNS.items():
        paths = [str(TRACES / f"{n}.json.gz") for n in names]
        hta = hta_figures(names)
        ours = {c: {r["rank"]: r for r in analyze_traces(paths, c)[0]["ranks"]} for c in ("hta", "partita")}
        for rank, h in hta.items():
            rows = [("HTA 0.5.0", h)] + [(f"partita ({c})", (r["window_us"], r["compute_pct"], r["non_compute_pct"],
                                                              r["idle_pct"], r["overlap_pct"]))
                                         for c, r in ((c, ours[c][rank]) for c in ("hta", "partita"))]
            for label, f in rows:
                print(f"{run:4} {rank:>4} {label:17} {f[0] / 1e3:10.1f} {f[1]:9.2f} {f[2]:9.2f} {f[3]:7.2f} {f[4]:9.2f}")
            worst = max(worst, *(abs(a - b) for a, b in zip(rows[1][1][1:], h[1:])))
    print(f"largest difference, --conventions hta vs HTA: {worst:.2f} points")


if __name__ == "__main__":
    main()
