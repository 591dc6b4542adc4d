"""Predict every published run we can express and print the error: out of sample first.

    python bench/validate_published.py [--csv PATH] [--rows] [--features] [--ablate] [--refit] [--worst N]

The data: the 470-row data/published_runs.csv by default (``--csv tests/data/published_runs.csv``:
the 266-row copy the older tests use). Printed first, the **out-of-sample** figures
(``bench/out_of_sample.py``): leave-one-source-out (each source's step times predicted with
efficiencies fitted without it, from their unfitted values) and a time split (fitted on the
rows published before 2025-01, predicting the later ones), overall, per feature class (dense,
MoE, long context / cp > 1, vpp >= 4, fp8, FSDP2 / ZeRO-3, Ascend) and per source; memory rows,
which no fitted constant touches, with the count under / over; the signed error by
publication year; with ``--worst N``, the N worst step-time rows of the time split and of
leave-one-source-out (source, device, layout, classes, signed error: the families
docs/accuracy.md's "worst out-of-sample rows" names a missing mechanism for). Then the
**in-sample** figures (the shipped constants, fitted on these
rows), labelled so. ``--ablate`` adds, per fitted constant, the leave-one-source-out error
with it held at its unfitted value. Fits are cached in bench/loso_fits.json (``--refit``
recomputes them; a stale cache is refitted anyway: 2-3 minutes, the ablation ~15 more).

Step-time rows compare the predicted step time with the step time the measured figure
implies under its source's own FLOP accounting; memory rows compare the peak as the
source's memory statistic reads it (``SourceFacts.memory_stat``: allocated, reserved or
the device's reading; ``Estimate.peak_memory_gib_as``). What
each source's runs share (framework, gradient dtype, overlap, FLOP accounting) comes
from ``published_runs.SOURCE_FACTS``, cited per source. ``--features`` adds the in-sample
step-time error grouped by what a plan shares with others (few micro-batches, ZeRO stage,
data-parallel size, pipeline, MoE, framework, device).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import out_of_sample as oos
from partita.estimate import estimate
from published_runs import SOURCE_FACTS, load_cases

DEFAULT_CSV = oos.FULL_CSV  # the 470-row table (tests/data/published_runs.csv: its first 266 rows)
CLASSES = ("dense", "moe", "long context / cp>1", "vpp>=4", "fp8", "fsdp2/zero3", "ascend")


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


def _line(label: str, st: dict) -> str:
    if not st.get("rows"):
        return f"  {label:28s} {0:5d}"
    return (f"  {label:28s} {st['rows']:5d} {st['median']:8.1%} {st['p90']:8.1%} {st['mean_signed']:+9.1%} "
            f"{st['median_signed']:+9.1%} {st['under']:5d} {st['over']:5d}")


def print_table(title: str, rows: list[oos.OosRow], by_source: bool = False) -> dict[str, float]:
    """Overall, per feature class (and per source) error of ``rows``; returns the overall summary."""
    print(f"\n{title}")
    print(f"  {'':28s} {'rows':>5s} {'median':>8s} {'p90':>8s} {'mean sgn':>9s} {'med sgn':>9s} {'under':>5s} "
          f"{'over':>5s}")
    overall = oos.summary(rows)
    print(_line("ALL", overall))
    for c in CLASSES:
        part = [r for r in rows if c in r.classes]
        if part:
            print(_line(c, oos.summary(part)))
    if by_source:
        for source in sorted({r.source for r in rows}):
            print(_line("  " + source, oos.summary([r for r in rows if r.source == source])))
    return overall


def print_by_year(rows: list[oos.OosRow]) -> None:
    """Signed step-time error by publication year: positive = predicted slower than measured."""
    print("\nleave-one-source-out step time by publication year (signed: + = predicted too slow)")
    for year in sorted({r.date[0] for r in rows}):
        part = oos.summary([r for r in rows if r.date[0] == year])
        print(f"  {year}  {part['rows']:4d} rows  median |err| {part['median']:6.1%}  "
              f"median signed {part['median_signed']:+6.1%}  sources "
              f"{', '.join(sorted({r.source for r in rows if r.date[0] == year}))}")


def print_drift(fits: oos.Fits) -> None:
    """The date term, measured out of sample (``out_of_sample.date_drift``)."""
    d = oos.date_drift(fits)
    print(f"\ndate term step x exp(-b (t - t0)): b fitted on the pre-split rows = {d['slope_per_year']:+.3f} per year")
    for label, key in (("time split", "time_split"), ("time split + date term", "time_split_drift"),
                       ("leave one source out", "loso"), ("LOSO + date term (b from the other sources)", "loso_drift")):
        st = d[key]
        print(f"  {label:44s} median {st['median']:6.1%}  p90 {st['p90']:6.1%}  median signed {st['median_signed']:+6.1%}")
    print("  controlled pairs (the same run - model shape, layout, devices, precision - in two releases):")
    for p in d["pairs"]:
        print(f"    {p['model'][:22]:22s} {p['earlier']} -> {p['later']} ({p['years']:.1f} y, {p['rows']} runs): "
              f"later step / earlier {p['median_ratio']:.3f} (median)")


def worst_rows(fits: oos.Fits, n: int) -> dict[str, list[tuple[oos.OosRow, object]]]:
    """The ``n`` step-time rows of the time split and of leave-one-source-out with the largest
    |error|, each beside its case (device, plan), worst first. The predictions come out in the
    order of ``fits.cases`` (all of them for leave-one-source-out, those dated from
    ``oos.CUTOFF`` for the time split), which pairs each row with its case."""
    loso_cases = list(fits.cases)
    split_cases = [c for c in fits.cases if tuple(c.date) >= oos.CUTOFF]
    out: dict[str, list[tuple[oos.OosRow, object]]] = {}
    for label, rows, cases in (("time split", oos.time_split_predictions(fits), split_cases),
                               ("leave one source out", oos.loso_predictions(fits), loso_cases)):
        pairs = [(r, c) for r, c in zip(rows, cases, strict=True) if r.metric == "step_time_s"]
        if any((r.source, r.name, r.measured) != (c.source, c.name, c.measured) for r, c in pairs):
            raise RuntimeError(f"{label}: out_of_sample's predictions no longer come in the order of its cases")
        out[label] = sorted(pairs, key=lambda rc: -abs(rc[0].signed))[:n]
    return out


def print_worst(fits: oos.Fits, n: int) -> None:
    """Print :func:`worst_rows` (signed: + = predicted too slow)."""
    for label, pairs in worst_rows(fits, n).items():
        print(f"\nworst {len(pairs)} step-time rows, {label} (signed: + = predicted too slow)")
        for r, c in pairs:
            print(f"  {r.signed:+7.1%} {r.source:24s} {r.name[:34]:34s} {c.cluster.device.name:18s} "
                  f"n={c.cluster.world_size:<5d} {c.plan.summary():44s} {'/'.join(r.classes)}")


def out_of_sample(csv_path: Path, refit: bool = False, show_rows: bool = False) -> dict[str, dict]:
    """Print the out-of-sample figures (leave one source out, time split, memory) and return
    their overall summaries."""
    fits = oos.Fits(csv_path, refit=refit)
    if fits.stale and not refit:
        print("(bench/loso_fits.json is stale for these inputs: refitting, a few minutes)")
    loso = oos.loso_predictions(fits)
    step = [r for r in loso if r.metric == "step_time_s"]
    mem = [r for r in loso if r.metric == "peak_memory_gib"]
    print("=== OUT OF SAMPLE: rows predicted with efficiencies not fitted to them ===")
    out = {"loso_step": print_table("step time, leave one source out (each source's rows predicted with "
                                    "efficiencies fitted on the other sources)", step, by_source=True)}
    split = [r for r in oos.time_split_predictions(fits) if r.metric == "step_time_s"]
    y, m = oos.CUTOFF
    out["time_split_step"] = print_table(f"step time, time split (fitted on rows published before {y}-{m:02d}, "
                                         "predicting the later ones)", split, by_source=True)
    out["memory"] = print_table("peak memory (no fitted constant touches memory: the model as it stands)", mem,
                                by_source=True)
    print_by_year(step)
    print_drift(fits)
    if show_rows:
        for r in loso:
            print(f"  {r.source:24s} {r.name:28s} {r.metric:15s} measured {r.measured:9.3f} "
                  f"predicted {r.predicted:9.3f} err {r.signed:+.1%}  {'/'.join(r.classes)}")
    return out


def print_ablation(csv_path: Path) -> None:
    """Per fitted constant: leave-one-source-out and in-sample step-time median error with it
    held at its unfitted value (``out_of_sample.ablation``), over all rows and over the rows
    of the groups it is fitted in, beside the values with the fit."""
    res = oos.ablation(oos.Fits(csv_path))
    base, ins = res[0]["loso_base"], res[0]["in_sample_base"]
    print(f"\nablation: each fitted constant held at its unfitted value (LOSO median {base['median']:.1%}, "
          f"p90 {base['p90']:.1%}; in sample {ins['median']:.1%}, {ins['p90']:.1%})")
    print(f"  {'constant':40s} {'value':>8s} {'unfit':>6s} {'dLOSO med/p90':>14s} {'own rows LOSO':>17s} "
          f"{'own rows in sample':>19s}  sources")
    for r in res:
        lo, own, ino = r["loso"], r["loso_own"], r["in_sample_own"]
        own_b, ino_b = r["loso_own_base"], r["in_sample_own_base"]
        print(f"  {r['constant']:40s} {r['value']:8.4g} {r['unfitted']:6.4g} "
              f"{lo['median'] - base['median']:+6.1%}/{lo['p90'] - base['p90']:+6.1%} "
              f"{own_b.get('median', 0):6.1%} -> {own.get('median', 0):6.1%} "
              f"{ino_b.get('median', 0):7.1%} -> {ino.get('median', 0):6.1%}  {', '.join(r['sources']) or '-'}")
    print("  (own rows: the step rows of the groups the constant is fitted in, median |error| with the fit -> "
          "without; a constant whose rows all come from one source cannot move LOSO - that source is "
          "predicted unfitted anyway)")


def run(csv_path: Path, show_rows: bool = False, features: bool = False) -> dict[str, float]:
    """Print the in-sample figures: every row with the shipped constants."""
    print("\n=== IN SAMPLE: the shipped constants, fitted on these same rows ===")
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
        print(f"\n{metric} (in sample): absolute percentage error")
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
    parser.add_argument("--features", action="store_true", help="print the in-sample step-time error by plan feature")
    parser.add_argument("--ablate", action="store_true", help="per fitted constant, the error without its fit")
    parser.add_argument("--refit", action="store_true", help="recompute the cached out-of-sample fits")
    parser.add_argument("--worst", type=int, default=0, metavar="N",
                        help="list the N worst out-of-sample step-time rows (time split, leave one source out)")
    args = parser.parse_args()
    if args.worst < 0:
        print(f"--worst takes a row count >= 0, got {args.worst}", file=sys.stderr)
        return 2
    if not args.csv.exists():
        print(f"published runs file {args.csv} not found; pass --csv", file=sys.stderr)
        return 2
    out_of_sample(args.csv, args.refit, args.rows)
    if args.worst:
        print_worst(oos.Fits(args.csv), args.worst)
    run(args.csv, args.rows, args.features)
    if args.ablate:
        print_ablation(args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
