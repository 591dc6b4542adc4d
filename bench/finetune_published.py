"""Predict published fine-tuning memory and throughput figures with Partita; report the error
per source and metric (issue 36 item 5).

Every row of ``data/published_finetune.csv`` is one figure a source published (URL at a pinned
commit, the table line quoted, the setup as the source states it; the ``notes`` say what was
assumed where the source is silent). Each is predicted as a user would ask Partita: the model
(a preset, or the Hugging Face ``config.json`` values in :data:`HF_CONFIGS`), the device, the
layout, ``finetune=full|lora`` with the source's rank and target set, and the framework the
source ran (Megatron for NeMo 24.07 and Megatron-SWIFT, DeepSpeed for ``swift sft``, torchtitan -
Partita's FSDP2 + ``torch.compile`` entry - for NeMo AutoModel and torchtune; the LLaMA-Factory
rows keep tests/test_finetune_cost.py's settings).

**Nothing is fitted to these rows**: the device files and framework entries are the catalog's,
unchanged; every error is out of sample. Rows marked ``modelled=no`` (a state layout no Partita
framework has, a saturated memory reading) are printed but left out of the statistics.

Packed rows whose attention runs per sample carry ``sample_len`` (``sum(L^2) / sum(L)``, the plan
field of that name); where the source does not publish its samples' lengths the value is an
assumption the notes state, and ``--what-if-sample-len N`` shows how much it matters.

Run ``python bench/finetune_published.py`` (about two seconds); ``--rows`` prints every row.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from partita.cost.memory import GIB
from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.hf_config import parse_hf_config
from partita.spec.load import load_model

CSV = ROOT / "data" / "published_finetune.csv"

_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "rms_norm_eps": 1e-5,
          "max_position_embeddings": 131072, "rope_theta": 500000.0, "attention_bias": False}
_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "rms_norm_eps": 1e-6,
          "max_position_embeddings": 32768, "rope_theta": 1000000.0, "vocab_size": 152064, "tie_word_embeddings": False,
          "num_attention_heads": 40, "num_key_value_heads": 8, "hidden_size": 5120}
#: Architectures without a preset, from each model's Hugging Face config.json
#: (huggingface.co/meta-llama/Llama-3.2-3B, /Qwen/Qwen2.5-14B, /Qwen/Qwen2.5-32B-Instruct).
HF_CONFIGS: dict[str, dict] = {
    "llama3.2-3b": {**_LLAMA, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
                    "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": True},
    "qwen2.5-14b": {**_QWEN2, "intermediate_size": 13824, "num_hidden_layers": 48},
    "qwen2.5-32b": {**_QWEN2, "intermediate_size": 27648, "num_hidden_layers": 64},
}


#: Which memory statistic each source's memory column reads (:meth:`partita.estimate.Estimate.peak_memory_gib_as`),
#: so each row compares like with like; opt-in per source, a source not named here reads the whole device
#: ("device": allocated + the allocator's slack + the runtime's context and workspaces).
#: - ms-swift: nvidia-smi (the device's reading; examples/megatron/benchmark/deepspeed.sh at 3602360a runs with
#:   PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True', so the caching allocator's slack is small there);
#: - LLaMA-Factory: a hardware requirement (what the device must hold: the whole peak);
#: - torchtune: 'Peak Memory Active' = torch.cuda.memory_stats()["active_bytes.all.peak"] (torchtune's
#:   get_memory_stats, torchtune/training/memory.py; utils/memory.py in early releases): allocated, no slack, no
#:   context (the rows are not modelled: notes).
MEMORY_READING: dict[str, str] = {
    "ms-swift-megatron-benchmark": "device",
    "llama-factory-readme": "device",
    "torchtune-readme-optimization-flags": "allocated",
}


@dataclass
class Result:
    """One published figure and Partita's prediction of it."""

    source: str
    label: str
    metric: str
    published: float
    predicted: float
    modelled: bool

    @property
    def error(self) -> float:
        """Signed relative error of the prediction, ``predicted / published - 1``."""
        return self.predicted / self.published - 1


def read_rows(path: Path = CSV) -> list[dict[str, str]]:
    """The CSV's rows (``#`` lines are its header comment)."""
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines))


def model_of(name: str):
    """A preset, or ``hf:NAME`` parsed from :data:`HF_CONFIGS`."""
    return parse_hf_config(HF_CONFIGS[name[3:]]) if name.startswith("hf:") else load_model(name)


def plan_of(r: dict[str, str]) -> Plan:
    """The plan a user would give for the row's setup."""
    parts = [f"dp={r['dp']}", f"tp={r['tp']}", f"pp={r['pp']}", f"mbs={r['micro_batch']}", f"gbs={r['global_batch']}",
             f"seq_len={r['seq_len']}", f"recompute={r['recompute']}", f"zero={r['zero']}", f"dtype={r['dtype']}",
             f"framework={r['framework']}", f"finetune={r['method']}"]
    if int(r["tp"]) > 1 and r["sp"] == "1":
        parts.append("sp=1")
    if r["method"] == "lora":
        parts += [f"lora_rank={r['lora_rank']}", f"lora_targets={r['lora_targets']}"]
    if r["sample_len"]:  # packed samples, attention per sample (plan.sample_len)
        parts.append(f"sample_len={r['sample_len']}")
    return Plan.parse(",".join(parts), int(r["devices"]))


def predict(r: dict[str, str]) -> float:
    """Partita's value of the row's metric (memory of the most loaded device; tokens/s per device
    = global batch x sequence length / step time / devices; seconds per global step)."""
    devices = int(r["devices"])
    est = estimate(model_of(r["model"]), make_cluster(r["hardware"], devices), plan_of(r))
    metric = r["metric"]
    reading = MEMORY_READING.get(r["source"], "device")
    if metric == "memory_gb":
        return est.peak_memory_gib_as(reading) * GIB / 1e9
    if metric == "memory_gib":
        return est.peak_memory_gib_as(reading)
    if metric == "step_time_s":
        return est.step_time_s
    if metric == "tokens_per_s_per_device":
        return int(r["global_batch"]) * int(r["seq_len"]) / est.step_time_s / devices
    raise ValueError(f"unknown metric {metric!r} in {CSV.name}: use memory_gb, memory_gib, step_time_s or tokens_per_s_per_device")


def evaluate(path: Path = CSV) -> list[Result]:
    """Every row predicted."""
    out = []
    for r in read_rows(path):
        label = f"{r['model']} {r['method']}{'-r' + r['lora_rank'] if r['method'] == 'lora' else ''} {r['devices']}x{r['hardware']} " \
                f"tp{r['tp']} pp{r['pp']} dp{r['dp']} z{r['zero']} {r['framework']}"
        out.append(Result(r["source"], label, r["metric"], float(r["published"]), predict(r), r["modelled"] == "yes"))
    return out


def summary(results: list[Result]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (source, metric class): rows, median |error|, worst |error|, median signed error -
    over the modelled rows only."""
    groups: dict[tuple[str, str], list[float]] = {}
    for res in results:
        if res.modelled:
            kind = "memory" if res.metric.startswith("memory") else "throughput"
            groups.setdefault((res.source, kind), []).append(res.error)
    return {key: {"n": len(errs), "median_abs": statistics.median(abs(e) for e in errs),
                  "worst_abs": max(abs(e) for e in errs), "median_signed": statistics.median(errs)}
            for key, errs in sorted(groups.items())}


def what_if_sample_len(n: int) -> int:
    """Sensitivity of the packed rows (``sample_len`` set: NeMo 24.07's SQuAD, torchtune's
    alpaca) to the assumed sample length: each row's error without per-sample attention
    (``sample_len`` 0: attention over the whole packed sequence), at the CSV's value and at
    ``n``. A diagnostic, not a fit."""
    if n <= 0:
        print(f"error: --what-if-sample-len must be a positive token count (got {n}); try 256 or 512", file=sys.stderr)
        return 2
    for r in read_rows():
        if not r["sample_len"]:
            continue
        pub = float(r["published"])
        if not r["metric"].startswith("tokens"):
            continue
        errs = [predict(dict(r, sample_len=v)) / pub - 1 for v in ("", r["sample_len"], str(n))]
        print(f"{r['source']:38s} {r['model']:15s} {r['method']:5s} whole sequence {errs[0]:+7.1%}   "
              f"sample_len {r['sample_len']}: {errs[1]:+7.1%}   sample_len {n}: {errs[2]:+7.1%}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", action="store_true", help="print every row's prediction")
    parser.add_argument("--what-if-sample-len", type=int, metavar="N",
                        help="diagnostic: the packed rows' errors with attention over the whole sequence, at the "
                             "CSV's sample_len and at N tokens per sample")
    args = parser.parse_args()
    if args.what_if_sample_len:
        return what_if_sample_len(args.what_if_sample_len)
    results = evaluate()
    if args.rows:
        for res in results:
            flag = "" if res.modelled else "  (not modelled: see notes)"
            print(f"{res.source:38s} {res.metric:24s} {res.label:70s} published {res.published:10.2f} "
                  f"predicted {res.predicted:10.2f} {res.error:+7.1%}{flag}")
        print()
    print(f"{'source':38s} {'metric':10s} {'rows':>4s} {'median |err|':>12s} {'worst |err|':>11s} {'median err':>10s}")
    for (source, kind), st in summary(results).items():
        print(f"{source:38s} {kind:10s} {st['n']:4d} {st['median_abs']:12.1%} {st['worst_abs']:11.1%} {st['median_signed']:+10.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
