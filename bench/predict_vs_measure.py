"""Close the loop on this machine: calibrate, predict the step time of several plans, run
them, and compare.

    python bench/predict_vs_measure.py [--repeats 2] [--steps 6]

1. `partita calibrate --nproc N` writes a hardware file for this CPU for each process
   count N the plans use (processes share the cores, so N changes the GEMM rate);
2. every plan below is estimated on it and trained with `partita train` (gloo), its step
   time the median over steps 2.. of each run and the median over repeats;
3. the benchmark prints each plan's predicted and measured step time, the Spearman rank
   correlation and the median absolute error.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

MODEL = "small-llama"
PLANS = [("dp=2", 2), ("tp=2", 2), ("pp=2", 2), ("dp=2,zero=3", 2), ("dp=2,recompute=full", 2),
         ("dp=2,mbs=2", 2), ("dp=2,tp=2", 4), ("dp=4", 4)]
COMMON = dict(gbs=8, seq_len=128, mbs=1, dtype="fp32")


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for rank, i in enumerate(order):
            r[i] = rank
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def measure(plan: str, nproc: int, steps: int) -> float:
    cmd = [sys.executable, "-m", "partita", "train", "--model", MODEL, "--plan", plan + ",gbs=8,seq_len=128",
           "--nproc", str(nproc), "--steps", str(steps), "--json", "--optimizer", "sgd", "--lr", "0.01"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    times = [json.loads(l)["step_time_s"] for l in proc.stdout.splitlines() if l.startswith("{")]
    return statistics.median(times[2:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--hardware", help="an existing calibrated file (default: calibrate now)")
    args = p.parse_args()
    files = {}
    for nproc in sorted({n for _, n in PLANS}):
        if args.hardware:
            files[nproc] = args.hardware
            continue
        files[nproc] = os.path.join(tempfile.mkdtemp(), f"calibrated-{nproc}.json")
        subprocess.run([sys.executable, "-m", "partita", "calibrate", "--nproc", str(nproc), "-o", files[nproc]],
                       check=True, timeout=600)
    model = load_model(MODEL)
    rows = []
    for text, nproc in PLANS:
        plan = Plan.parse(text, world_size=nproc, defaults=dict(COMMON))
        predicted = estimate(model, make_cluster(files[nproc], nproc), plan).step_time_s
        measured = statistics.median(measure(text, nproc, args.steps) for _ in range(args.repeats))
        rows.append((plan.summary(), predicted, measured))
        print(f"{plan.summary():36s} predicted {predicted * 1e3:8.1f} ms   measured {measured * 1e3:8.1f} ms   "
              f"error {(predicted - measured) / measured:+.0%}", flush=True)
    pred, meas = [r[1] for r in rows], [r[2] for r in rows]
    errors = [abs(p_ - m) / m for p_, m in zip(pred, meas)]
    print(f"\nSpearman rank correlation {spearman(pred, meas):.2f}; median absolute error {statistics.median(errors):.0%} "
          f"over {len(rows)} plans ({args.repeats} repeats each)")


if __name__ == "__main__":
    main()
