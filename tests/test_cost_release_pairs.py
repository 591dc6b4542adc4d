"""The controlled release pairs bench/validate_published.py prints beside the date term (issue 33
item 5): the same run published in two releases. Oracle: the CSV cells themselves - NeMo 24.07's
LLAMA3-8B fp8 cp2 run on 8 H100 and dgxc v25.04.02's Llama3.1-8B run of the same shape and layout,
the first printed as tokens/s per GPU (step = global batch x sequence / (tokens/s/GPU x GPUs)), the
second as a step time."""
import csv
from pathlib import Path

from out_of_sample import controlled_pairs
from published_runs import load_cases

FULL_CSV = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"


def test_release_pair_ratio_is_the_printed_step_times():
    cases, _ = load_cases(FULL_CSV)
    pairs = {(p["earlier"], p["later"], p["model"]): p for p in controlled_pairs(
        [c for c in cases if c.metric == "step_time_s"])}
    with open(FULL_CSV, newline="") as f:
        rows = list(csv.DictReader(f))

    def step(source_part: str, name: str) -> float:
        hit = [r for r in rows if source_part in r["source"] and r["model_name"] == name and r["n_devices"] == "8"
               and r["measured_metric"] != "peak_mem_gib" and r["notes"].startswith("precision=fp8")]
        assert len(hit) == 1, hit
        r = hit[0]
        if r["measured_metric"] == "iter_time_s":
            return float(r["measured_value"])
        assert r["measured_metric"] == "tokens_per_s_per_gpu"
        return int(r["global_batch"]) * int(r["seq_len"] or 8192) / (float(r["measured_value"]) * 8)
    ratio = step("v25.04", "Llama3.1-8B") / step("24.07", "LLAMA3-8B")
    pair = pairs[("nemo-24.07", "dgxc-25.04", "Llama3.1-8B")]
    assert pair["rows"] == 1 and abs(pair["median_ratio"] - ratio) < 1e-9
    assert ratio < 0.9  # the later release runs the same job >10 % faster
    grok = pairs[("dgxc-24.11", "dgxc-25.04", "Grok-1-314B")]
    assert grok["rows"] == 18 and 0.95 < grok["median_ratio"] < 1.05  # and the Grok runs did not move
