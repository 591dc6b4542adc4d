"""Published runs that the planner would rule out: every row of ``data/published_runs.csv``
(as :func:`published_runs.load_cases` reads it) whose layout has ``P(fit)`` below 5 %.

Issue 33: "no layout that ran has P(fit) below 5 %". Each of these rows *ran* at its stated
layout, so a row listed here is a memory model that over-predicts it, a loader that reads its
layout wrongly, or an interval too tight for its class. The script prints, per row, the
predicted peak (the whole device peak, which is what P(fit) is judged on), its breakdown by
part on the peak pipeline rank, the limit, the memory class used, P(fit) and the row's notes.

    python bench/ran_but_ruled_out.py            # the rows below 5 %
    python bench/ran_but_ruled_out.py --below 0.2 # a wider net
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from partita.cost.memory import GIB  # noqa: E402
from partita.estimate import estimate  # noqa: E402
from partita.uncertainty import DEFAULT_MIN_P_FIT  # noqa: E402
from published_runs import _case, source_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CSV = ROOT / "data" / "published_runs.csv"


def ruled_out(csv_path: Path = DEFAULT_CSV, below: float = DEFAULT_MIN_P_FIT) -> list[tuple[dict, object, object]]:
    """(csv row, case, estimate) for every loadable row whose plan has P(fit) < ``below``."""
    from partita.errors import PartitaError
    out = []
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            if source_key(row["source"]) is None:
                continue
            try:
                case = _case(row)
            except PartitaError:
                continue
            est = estimate(case.model, case.cluster, case.plan)
            if est.p_fit < below:
                out.append((row, case, est))
    return out


def describe(row: dict, case, est) -> str:
    """A readable block: layout, predicted peak with its parts, limit, P(fit), notes."""
    p = case.plan
    lines = [f"{case.source}: {case.name} on {case.cluster.world_size} x {case.cluster.device.name} "
             f"({row['measured_metric']} {row['measured_value']})",
             f"  layout dp={p.dp} tp={p.tp} pp={p.pp} vpp={p.vpp} cp={p.cp} ep={p.ep} etp={p.etp} sp={p.sp} "
             f"zero={p.zero} mbs={p.mbs} gbs={p.gbs} seq={p.seq_len} recompute={p.recompute}"
             f"/{p.recompute_layers} dtype={p.dtype} framework={p.framework}",
             f"  predicted peak {est.peak_memory_gib:.1f} GiB (pipeline rank {est.peak_rank.rank}); "
             f"limit {est.limit.describe()}; class {est.memory_residuals.name}; P(fit) {est.p_fit:.3f}"]
    for name, value in sorted(est.peak_rank.parts.items(), key=lambda kv: -kv[1]):
        if value:
            lines.append(f"    {name:40s} {value / GIB:8.2f} GiB")
    lines.append(f"  csv: recompute={row['recompute']!r} zero={row['zero_stage/fsdp']!r}")
    lines.append(f"  notes: {row['notes']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    ap.add_argument("--below", type=float, default=DEFAULT_MIN_P_FIT, help="P(fit) threshold (default 0.05)")
    args = ap.parse_args()
    rows = ruled_out(args.csv, args.below)
    for row, case, est in rows:
        print(describe(row, case, est), end="\n\n")
    print(f"{len(rows)} published rows with P(fit) < {args.below:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
