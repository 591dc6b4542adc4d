"""How fast is the plan search over the whole space? Prints candidates, candidates/s, wall time.

    python bench/search_speed.py [--repeats 5]

Target (issue 3): under 1 s per scenario on one core. Each repeat runs in a fresh Python
process, so every memo starts cold (what a user's `partita plan` sees); the search itself
is timed, not the interpreter start. The figures are the median and the slowest of the
repeats (shared 2-core machines vary by +-30 % from run to run), and the least and the
median CPU time of the process (``time.process_time``: what the search costs when other
jobs share the cores - on a loaded machine the wall time is several times the CPU time).
The load average is printed before and after: report it next to the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

SCENARIOS = [
    ("gpt3-175b", "h100-sxm", 1024, 1536, 2048),
    ("llama-65b", "ascend-910b2", 512, 2048, 2048),
    ("deepseek-v3", "h800", 2048, 15360, 4096),
    ("mixtral-8x22b", "ascend-910b2", 256, 1024, 4096),
]

_ONE_RUN = """
import json, sys, time
from partita.search import search_plans
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model
name, hw, n, gbs, seq = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model, cluster = load_model(name), make_cluster(hw, n)
t0, c0 = time.perf_counter(), time.process_time()
result = search_plans(model, cluster, gbs, seq)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"wall": wall, "cpu": cpu, "evaluated": result.candidates_evaluated,
                  "ruled_out": result.candidates_pruned + result.candidates_bounded,
                  "best": result.best.plan.summary() if result.best else "nothing fits"}))
"""


def run_once(scenario: tuple) -> dict:
    proc = subprocess.run([sys.executable, "-c", _ONE_RUN, *map(str, scenario)], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("load average (1, 5, 15 min) at start: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"{'scenario':36s} {'evaluated':>9s} {'ruled out':>9s} {'cand/s':>7s} {'median s':>8s} {'max s':>6s} "
          f"{'cpu min':>7s} {'cpu med':>7s}  best plan")
    for scenario in SCENARIOS:
        runs = [run_once(scenario) for _ in range(args.repeats)]
        walls = [r["wall"] for r in runs]
        cpus = [r["cpu"] for r in runs]
        med = statistics.median(walls)
        first = runs[0]
        name = f"{scenario[0]} on {scenario[2]} {scenario[1]}"
        print(f"{name:36s} {first['evaluated']:9d} {first['ruled_out']:9d} {first['evaluated'] / med:7.0f} "
              f"{med:8.2f} {max(walls):6.2f} {min(cpus):7.2f} {statistics.median(cpus):7.2f}  {first['best']}")
    print("load average (1, 5, 15 min) at end: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
