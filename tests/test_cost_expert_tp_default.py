"""The expert tensor-parallel size a published MoE row ran with when its notes state none.

Megatron-Core sets ``expert_tensor_parallel_size = tensor_model_parallel_size`` when it is not
given (``megatron/core/parallel_state.py``, ``initialize_model_parallel``), so the NeMo recipes
of NVIDIA/dgxc-benchmarking shard every expert over the tp group. The oracle is the table
itself: the v25.05 release of the same Grok-1 recipe prints the layout with ``ETP=4`` beside
``TP=4``, and a row that states its ETP (Megatron CI ``etp1``, DeepSeek-V3 ``ETP=1``) keeps it."""
import csv
import re
from pathlib import Path

from published_runs import load_cases

FULL_CSV = Path(__file__).resolve().parents[1] / "data" / "published_runs.csv"


def _stated_etp(notes: str) -> int | None:
    m = re.search(r"\bETP[ =](\d+)", notes)
    return int(m.group(1)) if m else None


def test_unstated_etp_is_megatron_default_and_stated_etp_is_kept():
    with open(FULL_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    cases, _ = load_cases(FULL_CSV)
    moe = [c for c in cases if c.model.moe and c.source.startswith("dgxc")]
    assert len({c.source for c in moe}) == 3  # dgxc v24.11.1, v25.04.02, v25.05
    # what the table states: every Grok-1 row of v25.05 that prints its ETP prints ETP = TP
    stated = [(int(r["tp"]), _stated_etp(r["notes"])) for r in rows
              if "v25.05" in r["source"] and r["model_name"].startswith("Grok") and _stated_etp(r["notes"])]
    assert stated and all(tp == etp for tp, etp in stated)
    by_name: dict[str, list[int]] = {}
    for r in rows:
        if r["n_experts"] and "dgxc" in r["source"]:
            by_name.setdefault(r["model_name"], []).append(_stated_etp(r["notes"]) or -1)
    for c in moe:
        row_etps = by_name[c.name]
        if all(e == -1 for e in row_etps):  # silent rows: Megatron-Core's default
            assert c.plan.etp == c.plan.tp, (c.source, c.name)
        else:
            assert c.plan.etp in row_etps, (c.source, c.name)
    ci = [c for c in cases if c.model.moe and c.source == "megatron-ci"]
    assert ci and all(c.plan.etp == 1 for c in ci)  # its notes say ETP 1
