"""How fast is the plan search over the whole space? Prints candidates, candidates/s, wall time.

    python bench/search_speed.py

Target (issue 3): under 1 s per scenario on one core. Measured figures go in the README.
"""
from __future__ import annotations

import time

from partita.search import search_plans
from partita.spec.hardware import make_cluster
from partita.spec.model import load_model

SCENARIOS = [
    ("gpt3-175b", "h100-sxm", 1024, 1536, 2048),
    ("llama-65b", "ascend-910b2", 512, 2048, 2048),
    ("deepseek-v3", "h800", 2048, 15360, 4096),
    ("mixtral-8x22b", "ascend-910b2", 256, 1024, 4096),
]


def main() -> None:
    print(f"{'scenario':40s} {'candidates':>10s} {'cand/s':>9s} {'wall s':>7s}  best plan")
    for model_name, hw, n, gbs, seq in SCENARIOS:
        model, cluster = load_model(model_name), make_cluster(hw, n)
        t0 = time.perf_counter()
        result = search_plans(model, cluster, gbs, seq)
        wall = time.perf_counter() - t0
        best = result.best.plan.summary() if result.best else "nothing fits"
        print(f"{model_name + ' on ' + str(n) + ' ' + hw:40s} {result.candidates_evaluated:10d} "
              f"{result.candidates_evaluated / wall:9.0f} {wall:7.2f}  {best}")


if __name__ == "__main__":
    main()
