"""Out-of-sample residuals of every published run -> the interval table planning reads.

    python bench/fit_intervals.py [--csv PATH] [--quick] [--check]

Each row of ``data/published_runs.csv`` (470 rows) that the loader turns into a plan is
predicted out of sample and its log residual ``r = ln(measured / predicted)`` is stored,
sorted, per feature class (:func:`partita.uncertainty.step_classes` and
:func:`partita.uncertainty.memory_class_names`) and over all rows, in
``src/partita/catalog/intervals.json``, each class with its effective sample size (rows of
one source repeat one error: :func:`partita.uncertainty.effective_rows`, Kish's design
effect); :mod:`partita.uncertainty` turns them into 80 % intervals and P(fit) by split
conformal prediction counted in effective rows (Lei et al. 2018, Angelopoulos & Bates
2021). Deterministic: same CSV and constants, same file.

* step time: leave-one-source-out - each source's rows predicted with the efficiency
  constants ``bench/fit.py`` fits on the other sources of its hardware family
  (:func:`fit.loso`; a family's only source keeps the shipped constants, and fit.py says so);
* peak memory: the memory model as shipped, read as the source's memory statistic reads
  it (``SourceFacts.memory_stat``) - no memory constant is fitted on these rows, so every
  memory residual is already out of sample for the fit.

``--quick``: step time with the shipped constants (in sample; seconds instead of minutes).
Printed in both modes: the leave-one-source-out *coverage* of the 80 % intervals - for each
source, the intervals built from the other sources' residuals (same class rule, same
n_eff), and the share of the held-out source's rows inside them (:func:`loso_coverage`),
per metric and per feature class; the in-sample coverage (the stored table judging its own
rows) beside it, to show what holding out changes. ``--check``: exit 1
when the stored file differs from what this run computes.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from partita.estimate import estimate
from partita.uncertainty import (INTERVALS_FILE, LEVEL, MIN_EFFECTIVE, MIN_ROWS, MIN_SOURCES, Residuals,
                                 effective_rows, memory_class_names, pick, stands_alone, step_classes)
from published_runs import SOURCE_FACTS, load_cases

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "data" / "published_runs.csv"
METRICS = {"step_time_s": "step_time", "peak_memory_gib": "peak_memory"}


@dataclass(frozen=True)
class Row:
    """One published run, predicted out of sample: ``residual = ln(measured / predicted)``."""

    source: str
    metric: str  # "step_time" or "peak_memory"
    classes: tuple[str, ...]
    predicted: float
    measured: float

    @property
    def residual(self) -> float:
        return math.log(self.measured / self.predicted)


def memory_rows(cases) -> list[Row]:
    rows = []
    for case in cases:
        if case.metric != "peak_memory_gib":
            continue
        est = estimate(case.model, case.cluster, case.plan)
        pred = est.peak_memory_gib_as(SOURCE_FACTS[case.source].memory_stat)
        classes = memory_class_names(case.model, case.plan.seq_len, case.plan.dtype, case.cluster.device)
        rows.append(Row(case.source, "peak_memory", tuple(classes), pred, case.measured))
    return rows


def step_rows(csv_path: Path, quick: bool) -> list[Row]:
    """Step-time rows: leave-one-source-out predictions (``quick``: shipped constants)."""
    import fit  # bench/fit.py: its loso machinery, read not changed
    by_family = fit.step_cases(csv_path)
    rows = []
    for _family, cases in sorted(by_family.items()):
        ordered = [c for source in sorted({c.source for c in cases}) for c in cases if c.source == source]
        if quick:
            errors = fit.log_errors(ordered, {})
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                errors = [e for _, e in fit.loso({_family: cases})]
        for case, err in zip(ordered, errors):  # err = ln(predicted / measured)
            pred = case.measured * math.exp(err)
            classes = step_classes(case.model, case.plan, case.cluster.device)
            rows.append(Row(case.source, "step_time", tuple(classes), pred, case.measured))
    return rows


def residuals_of(name: str, group: list[Row]) -> Residuals:
    """A class's residuals, sorted (rounded to 1e-5: a stable file), with their sources and
    effective sample size (:func:`partita.uncertainty.effective_rows`, over the rounded values)."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in group:
        by_source[r.source].append(round(r.residual, 5))
    values = tuple(sorted(x for v in by_source.values() for x in v))
    return Residuals(name, values, len(by_source), round(effective_rows(by_source), 3))


def build_table(rows: list[Row]) -> dict[str, dict[str, Residuals]]:
    """Per metric, per class and "all": the sorted residuals and their n_eff (:func:`residuals_of`)."""
    out: dict[str, dict[str, Residuals]] = {}
    for metric in METRICS.values():
        groups: dict[str, list[Row]] = defaultdict(list)
        for row in rows:
            if row.metric == metric:
                groups["all"].append(row)
                for c in row.classes:
                    groups[c].append(row)
        out[metric] = {name: residuals_of(name, g) for name, g in sorted(groups.items())}
    return out


def inside(row: Row, tab: dict[str, Residuals]) -> bool:
    lo, hi = pick(list(row.classes), row.metric, tab=tab).bounds(LEVEL)
    return lo <= row.residual <= hi


def stored_rows(path: Path = INTERVALS_FILE) -> list[Row]:
    """The rows a stored table was built from (``"rows"`` of :func:`to_json`), as :class:`Row`
    with measured = exp(residual) and predicted = 1."""
    raw = json.loads(path.read_text())
    return [Row(src, metric, tuple(classes), 1.0, math.exp(res)) for metric, src, classes, res in raw["rows"]]


def loso_coverage(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """(rows inside, rows) of each source's rows against the 80 % intervals built from the
    other sources' residuals only - an honest out-of-sample check. Keys: each metric, "all",
    and "<metric>/<class>" for every feature class a row belongs to."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for source in sorted({r.source for r in rows}):
        rest = build_table([r for r in rows if r.source != source])
        for row in (r for r in rows if r.source == source):
            if row.metric not in rest or "all" not in rest[row.metric]:
                continue
            hit = inside(row, rest[row.metric])
            for key in (row.metric, "all", *(f"{row.metric}/{c}" for c in row.classes)):
                counts[key][0] += hit
                counts[key][1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def in_sample_coverage(rows: list[Row]) -> dict[str, tuple[int, int]]:
    """The same count against the table built from *all* rows, the judged ones included (what
    an in-sample check would report; printed beside :func:`loso_coverage`)."""
    tab = build_table(rows)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in rows:
        hit = inside(row, tab[row.metric])
        for key in (row.metric, "all"):
            counts[key][0] += hit
            counts[key][1] += 1
    return {k: (v[0], v[1]) for k, v in counts.items()}


def to_json(tab: dict[str, dict[str, Residuals]], csv_path: Path, quick: bool, rows: list[Row] = ()) -> str:
    data = {"level": LEVEL, "min_rows": MIN_ROWS, "min_sources": MIN_SOURCES, "min_effective_rows": MIN_EFFECTIVE,
            "provenance": f"bench/fit_intervals.py{' --quick' if quick else ''} on {csv_path.name}: "
                          "ln(measured/predicted), step time leave-one-source-out (bench/fit.py --loso), "
                          "peak memory as shipped (no memory constant is fitted); effective_rows: Kish's n_eff of "
                          "the rows clustered by source (partita.uncertainty: split conformal counted in n_eff)"}
    for metric, classes in tab.items():
        data[metric] = {name: {"rows": len(r.values), "sources": r.sources, "residuals": list(r.values),
                               "effective_rows": r.effective}
                        for name, r in classes.items()}
    # every row with its source and classes: the out-of-sample coverage check re-runs from these
    # (tests/test_uncertainty.py) without the minutes-long leave-one-source-out refit
    data["rows"] = sorted([r.metric, r.source, list(r.classes), round(r.residual, 5)] for r in rows)
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--quick", action="store_true", help="step time in sample (shipped constants): fast")
    parser.add_argument("--check", action="store_true", help="exit 1 when the stored table differs")
    parser.add_argument("--out", type=Path, default=INTERVALS_FILE)
    args = parser.parse_args()
    if not args.csv.exists():
        print(f"published runs file {args.csv} not found; pass --csv", file=sys.stderr)
        return 2
    cases, _ = load_cases(args.csv)
    rows = step_rows(args.csv, args.quick) + memory_rows(cases)
    tab = build_table(rows)
    for metric, classes in tab.items():
        print(f"{metric}: 80 % bounds per class (rows, sources, n_eff)")
        for name, r in classes.items():
            lo, hi = r.bounds(LEVEL)
            note = "" if name == "all" or stands_alone(r) else "  (too few rows, sources or n_eff: falls back to all)"
            print(f"  {name:14s} {len(r.values):4d} {r.sources:3d} {r.units:6.1f}  "
                  f"[{math.exp(lo) - 1:+.1%}, {math.exp(hi) - 1:+.1%}]{note}")
    print("leave-one-source-out coverage of the 80 % intervals (in sample beside it):")
    inner = in_sample_coverage(rows)
    for key, (hit, n) in sorted(loso_coverage(rows).items()):
        own = f"   (in sample {inner[key][0] / inner[key][1]:.1%})" if key in inner else ""
        print(f"  {key:26s} {hit:3d}/{n:3d} = {hit / n:.1%}{own}")
    text = to_json(tab, args.csv, args.quick, rows)
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print("stored table is up to date" if same else f"{args.out} differs: run python bench/fit_intervals.py")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
