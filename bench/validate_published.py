"""Predict every published run we can express and print the error, per source and overall.

    python bench/validate_published.py [--csv PATH] [--rows] [--features]

The data: tests/data/published_runs.csv by default (the 266-row copy the tests use);
``--csv data/published_runs.csv`` runs on the 470-row file (see its README).
Step-time rows compare the predicted step time with the step time the measured figure
implies under its source's own FLOP accounting; memory rows compare the peak as the
source's memory statistic reads it (``SourceFacts.memory_stat``: allocated, reserved or
the device's reading; ``Estimate.peak_memory_gib_as``). What
each source's runs share (framework, gradient dtype, overlap, FLOP accounting) comes
from ``published_runs.SOURCE_FACTS``, cited per source. Per source: rows,
median and p90 of the absolute error, mean signed error; then the skipped rows, by reason
and by source. ``--features`` adds the step-time error grouped by what a plan shares with
others (few micro-batches, ZeRO stage, data-parallel size, pipeline, MoE, framework, device):
where the residuals point at missing physics rather than at one source.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from partita.estimate import estimate
from published_runs import SOURCE_FACTS, load_cases

DEFAULT_CSV = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_runs.csv"  # the 266-row edition of data/published_runs.csv (470 rows)


def p90(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def plan_features(case) -> list[str]:
    """The groups a step-time row falls in for ``--features``: its plan's shape, not its source."""
    p = case.plan
    m = p.grad_accum
    return [f"micro-batches {'1' if m == 1 else '2-4' if m <= 4 else '5-32' if m <= 32 else '>32'}",
            f"zero {p.zero}", f"dp {'>=256' if p.dp >= 256 else '32-255' if p.dp >= 32 else '<32'}",
            "pp > 1" if p.pp > 1 else "pp 1", "moe" if case.model.moe_layers else "dense",
            f"framework {p.framework}", f"device {case.cluster.device.name}"]


def print_features(rows: list[tuple[list[str], float]]) -> None:
    """Median / p90 / mean signed step-time error per plan feature (:func:`plan_features`)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for features, err in rows:
        for f in features:
            groups[f].append(err)
    print("\nstep_time_s by plan feature")
    print(f"  {'feature':32s} {'rows':>5s} {'median':>8s} {'p90':>8s} {'mean signed':>12s}")
    for f, errs in sorted(groups.items()):
        a = [abs(e) for e in errs]
        print(f"  {f:32s} {len(errs):5d} {statistics.median(a):8.1%} {p90(a):8.1%} {statistics.mean(errs):+12.1%}")


def run(csv_path: Path, show_rows: bool = False, features: bool = False) -> dict[str, float]:
    cases, skipped = load_cases(csv_path)
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    signed: dict[str, list[float]] = defaultdict(list)
    by_feature: list[tuple[list[str], float]] = []
    for case in cases:
        est = estimate(case.model, case.cluster, case.plan)
        # memory rows: the peak as the source's statistic reads it (allocated / reserved / device)
        predicted = (est.step_time_s if case.metric == "step_time_s"
                     else est.peak_memory_gib_as(SOURCE_FACTS[case.source].memory_stat))
        err = (predicted - case.measured) / case.measured
        errors[case.metric][case.source].append(abs(err))
        signed[case.source + " " + case.metric].append(err)
        if case.metric == "step_time_s":
            by_feature.append((plan_features(case), err))
        if show_rows:
            print(f"{case.source:22s} {case.name:28s} n={case.cluster.world_size:5d} {case.plan.summary():42s} "
                  f"{case.metric:15s} measured {case.measured:9.3f} predicted {predicted:9.3f} err {err:+.1%}")
    summary: dict[str, float] = {}
    for metric in ("step_time_s", "peak_memory_gib"):
        print(f"\n{metric}: absolute percentage error")
        print(f"  {'source':24s} {'rows':>5s} {'median':>8s} {'p90':>8s} {'mean signed':>12s}")
        everything: list[float] = []
        for source, errs in sorted(errors[metric].items()):
            everything += errs
            mean_signed = statistics.mean(signed[source + " " + metric])
            print(f"  {source:24s} {len(errs):5d} {statistics.median(errs):8.1%} {p90(errs):8.1%} {mean_signed:+12.1%}")
        if everything:
            med, hi = statistics.median(everything), p90(everything)
            all_signed = [e for key, v in signed.items() if key.endswith(" " + metric) for e in v]
            print(f"  {'OVERALL':24s} {len(everything):5d} {med:8.1%} {hi:8.1%}   "
                  f"under {sum(e < 0 for e in all_signed)}, over {sum(e > 0 for e in all_signed)}")
            summary[metric + "_median"] = med
            summary[metric + "_p90"] = hi
            summary[metric + "_rows"] = len(everything)
    if features:
        print_features(by_feature)
    by_source: dict[str, int] = defaultdict(int)
    for label, _ in skipped:
        by_source[label.split(":", 1)[0]] += 1
    print(f"\nskipped {len(skipped)} rows; per source: "
          + ", ".join(f"{source} {count}" for source, count in sorted(by_source.items())))
    reasons: dict[str, list[str]] = defaultdict(list)
    for label, reason in skipped:
        reasons[reason].append(label)
    for reason, labels in reasons.items():
        print(f"  {len(labels):3d} x {reason}  (e.g. {labels[0]})")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument("--features", action="store_true", help="print the step-time error by plan feature")
    args = parser.parse_args()
    if not args.csv.exists():
        print(f"published runs file {args.csv} not found; pass --csv", file=sys.stderr)
        return 2
    run(args.csv, args.rows, args.features)
    return 0


if __name__ == "__main__":
    sys.exit(main())
