"""bench/predict_vs_measure.py's figures (issue 33 item 7): the Spearman rank correlation
against the Pearson correlation of the ranks (``statistics.correlation``, the definition), and
the targets it prints against hand-computed errors."""
from __future__ import annotations

import importlib.util
import random
import statistics
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "predict_vs_measure.py"
spec = importlib.util.spec_from_file_location("predict_vs_measure", BENCH)
pvm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pvm)


def _ranks(xs: list[float]) -> list[int]:
    return [sorted(xs).index(x) for x in xs]


def test_spearman_is_pearson_of_the_ranks():
    rng = random.Random(33)
    for _ in range(20):
        a = rng.sample(range(1000), 12)
        b = [x + rng.gauss(0, 300) for x in a]
        expected = statistics.correlation(_ranks(a), _ranks(b))
        assert abs(pvm.spearman(a, b) - expected) < 1e-12


def test_summary_checks_the_issue_targets(capsys):
    # errors +5 %, -10 %, +25 %: median 10 % (NOT <= 8 %), worst 25 % (NOT <= 20 %), ranks kept (1.0)
    rows = [("a", 1.05, 1.0), ("b", 1.8, 2.0), ("c", 3.75, 3.0)]
    pvm.summary(rows, 1, "hw.json")
    out = capsys.readouterr().out
    assert "median |error| 10%" in out and "worst 25% (c)" in out and "Spearman 1.00" in out
    assert "median |error| <= 8% NOT met" in out and "worst <= 20% NOT met" in out and "Spearman >= 0.9 met" in out


def test_the_load_is_the_kernels_line():
    text = pvm.load()
    assert text.startswith("loadavg ") and len(text.split()) == 6  # three averages, running/total, last pid


def test_round_robin_runs_every_plan_once_a_round_with_the_same_mean_position():
    n, repeats = 12, 4
    order = pvm.round_robin(n, repeats)
    assert len(order) == n * repeats
    for rnd in range(repeats):  # each round holds every plan once
        assert sorted(i for r, i in order if r == rnd) == list(range(n))
    # a load that drifts linearly over the run: every plan's repeats sit at the same mean slot,
    # the middle of the run ((n * repeats - 1) / 2), so the drift lands on every plan alike
    for i in range(n):
        slots = [k for k, (_, j) in enumerate(order) if j == i]
        assert len(slots) == repeats and statistics.mean(slots) == (n * repeats - 1) / 2
    assert pvm.round_robin(3, 1) == [(0, 0), (0, 1), (0, 2)]


def test_calibrates_on_the_plans_own_dense_model():
    dense = {model for model, _ in pvm.PLANS if model != "tiny-moe"}
    assert dense == {pvm.DENSE_MODEL}
