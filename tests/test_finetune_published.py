"""Published fine-tuning memory and throughput (data/published_finetune.csv) against Partita's
prediction, per source, at the tolerances docs/finetune.md states. The oracle is the published
figure; nothing in the cost model is fitted to these rows (bench/finetune_published.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("finetune_published", ROOT / "bench" / "finetune_published.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def results(bench):
    return bench.evaluate()


#: (source, metric class) -> (rows, median |error| bound, worst |error| bound), as docs/finetune.md
#: "Against published fine-tuning memory and throughput" states them
CLAIMS = {
    ("llama-factory-readme", "memory"): (6, 0.05, 0.15),
    ("ms-swift-megatron-benchmark", "memory"): (2, 0.20, 0.25),
    ("ms-swift-megatron-benchmark", "throughput"): (3, 0.07, 0.13),
    ("nemo-24.07-perf-summary", "throughput"): (6, 0.10, 0.19),
    ("nemo-automodel-perf-summary", "throughput"): (6, 0.08, 0.16),
    ("torchtune-readme-optimization-flags", "throughput"): (3, 0.11, 0.15),
}


def test_every_row_cites_its_source(bench) -> None:
    """Each figure carries a pinned URL and the quoted table line it was read from."""
    rows = bench.read_rows()
    assert len(rows) == 30
    for r in rows:
        assert r["url"].startswith("https://github.com/") and "/blob/" in r["url"], r
        assert r["published"] in r["quote"].replace("\\", ""), r  # the figure is in the quoted line
        assert r["modelled"] in ("yes", "no") and (r["modelled"] == "yes" or "excluded" in r["notes"])


def test_per_source_errors_within_the_documented_tolerance(bench, results) -> None:
    """Median and worst |error| per source and metric class, out of sample."""
    stats = bench.summary(results)
    assert set(stats) == set(CLAIMS)
    for key, (n, median_bound, worst_bound) in CLAIMS.items():
        st = stats[key]
        assert st["n"] == n, key
        assert st["median_abs"] <= median_bound, (key, st)
        assert st["worst_abs"] <= worst_bound, (key, st)


def test_per_sample_attention_is_what_closes_the_packed_rows(bench) -> None:
    """NeMo 24.07 packs SQuAD samples of a few hundred tokens into 4096-token sequences and runs
    attention per sample (THD): charged over the whole 4096 tokens instead (``sample_len`` 0),
    every row is predicted slower than published, by 24 % at the median (26 % while the LoRA rows
    also adapted linear_proj, before NeMo's qkv-only default); per sample, within the 10 % above. The assumed sample length hardly matters (200 to 512: 2.1 points at most, on a qkv-only LoRA row
    where attention is the larger share)."""
    import statistics
    rows = [r for r in bench.read_rows() if r["source"] == "nemo-24.07-perf-summary"]
    def errors(sample_len: str | None) -> list[float]:
        return [bench.predict(r if sample_len is None else dict(r, sample_len=sample_len)) / float(r["published"]) - 1
                for r in rows]
    whole = errors("")
    assert len(whole) == 6 and all(e < 0 for e in whole) and statistics.median(abs(e) for e in whole) > 0.2
    assert statistics.median(abs(e) for e in errors(None)) < 0.10
    assert max(abs(a - b) for a, b in zip(errors("200"), errors("512"))) < 0.025


def test_unknown_metric_is_a_one_line_error(bench) -> None:
    row = bench.read_rows()[0] | {"metric": "samples_per_s"}
    with pytest.raises(ValueError, match="use memory_gb, memory_gib") as err:
        bench.predict(row)
    assert "\n" not in str(err.value)


def test_per_sample_attention_counts_the_runtime_document_mask() -> None:
    """``sample_len`` (packed samples, attention per sample): the attention FLOPs Partita charges
    equal 2 x heads x (d_qk + d_v) x the (query, key) pairs that the runtime's own document mask
    allows on rows packed by the runtime's own ``pack`` - and with ``sample_len`` 0 the pairs of
    one causal sequence (the previous count, unchanged)."""
    import numpy as np

    from partita.cost.compute import layer_forward
    from partita.cost.shape import layer_shape
    from partita.plan import Plan
    from partita.runtime.hf_pipeline import document_mask
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    from partita.train.sft_data import pack
    import torch

    seq = 64
    lengths = [48, 16, 40, 24]  # two full rows: 48 + 16 and 40 + 24
    samples = [(np.arange(n), np.arange(n)) for n in lengths]
    rows = pack(samples, seq, pad_id=0)
    assert rows["inputs"].shape == (2, seq)
    pairs = int(document_mask(torch.as_tensor(rows["positions"])).sum())
    assert pairs == sum(n * (n + 1) // 2 for n in lengths)
    sample_len = sum(n * n for n in lengths) / sum(lengths)
    model, device = load_model("small-llama"), make_cluster("cpu", 1).device
    per_pair = 2 * model.heads * (model.q_dim // model.heads + model.attn_out_dim // model.heads)
    plan = Plan.parse(f"dp=1,gbs=2,mbs=2,seq_len={seq},dtype=fp32,sample_len={sample_len:g}", 1)
    assert plan.sample_len == 37 and Plan.from_dict(plan.to_dict()) == plan
    assert layer_forward(model, device, layer_shape(plan), False).attn_flops == per_pair * pairs
    whole = Plan.parse(f"dp=1,gbs=2,mbs=2,seq_len={seq},dtype=fp32", 1)
    causal_pairs = 2 * seq * (seq + 1) // 2
    assert layer_forward(model, device, layer_shape(whole), False).attn_flops == per_pair * causal_pairs
    assert "sample_len" not in whole.to_dict()


def test_seq_lengths_report_the_sample_len_to_pass(tmp_path, capsys) -> None:
    """``partita estimate --seq-lengths FILE --json`` reports ``attention_sample_len`` = sum L^2 / sum L
    over the file's samples cut to the sequence (hand count), and estimating with it as
    ``--sample-len`` prices a shorter attention, so a shorter step."""
    import json

    from partita.cli.main import main
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in [100, 300, 5000] * 10))
    common = ["--model", "llama3-8b", "--hardware", "h100-sxm", "--devices", "8", "--seq-lengths", str(lengths), "--json"]
    plan = "dp=8,gbs=32,seq_len=4096,finetune=lora"
    assert main(["estimate", *common, "--plan", plan]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dataset"]["attention_sample_len"] == round((100**2 + 300**2 + 4096**2) / (100 + 300 + 4096))
    assert main(["estimate", *common, "--plan", f"{plan},sample_len={out['dataset']['attention_sample_len']}"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] < out["step_time_s"]
