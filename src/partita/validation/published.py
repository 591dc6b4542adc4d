"""Turn rows of ``published_runs.csv`` into (model, cluster, plan, measured step time / memory).

Every measured figure is converted to what it implies about the step, using the
FLOP accounting of its own source (data/README.md):

* ``iter_time_s``: the step time itself;
* ``tokens_per_s_per_gpu``: ``gbs * seq / (value * n)``;
* ``tflops_per_gpu`` from the Megatron-LM 2021 paper, the DeepSpeed blog and InternLM:
  those count ``96 B s l h^2 (1 + s/6h + V/16lh)`` FLOPs per step (Narayanan et al.
  SC'21 appendix, with the recomputed forward); the Megatron-LM README (H100) counts
  model FLOPs, Megatron's ``num_floating_point_operations``:
  ``72 B s l h^2 (1 + s/6h + V/12lh)`` for a GPT with ffn = 4h;
* ``mfu_pct``: model FLOPs (Megatron formula) / (989 TF x n).

Framework facts that the rows imply but do not repeat are applied per framework and
cited, never per row: NeMo/dgxc runs keep bf16 main gradients (NeMo's
``grad_reduce_in_fp32=False``) and overlap TP communication (``tp_comm_overlap=True``
in the dgxc/NeMo recipes); the Megatron-LM README runs enable ``--tp-comm-overlap``.
Unknown micro-batch: 1; unknown recompute: none; unknown SP: on when tp > 1.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import PartitaError
from ..plan import Plan, balanced_split, validate
from ..spec.hardware import Cluster, make_cluster
from ..spec.model import ModelSpec

HARDWARE = {
    "A100-80GB-SXM": "a100-80gb", "A100-80GB": "a100-80gb", "A100-40GB": "a100-40gb",
    "H100-80GB-SXM": "h100-sxm", "H100-80GB": "h100-sxm", "H100-96GB-HBM2e": "h100-96gb-hbm2e",
    "H200-141GB": "h200",
}


@dataclass
class Case:
    """One published measurement, ready to predict."""

    source: str
    name: str
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    metric: str
    measured: float  # step time in s, or peak memory in GiB
    raw_metric: str
    raw_value: float


def short_source(source: str) -> str:
    for key, short in (("Narayanan", "megatron-2021"), ("Megatron-LM README", "megatron-readme-h100"),
                       ("DeepSpeed", "deepspeed-zero3"), ("asyncTP", "torchtitan-h100"),
                       ("trainy", "torchtitan-h200"), ("NeMo", "nemo-24.07"), ("dgxc", "dgxc-25.04"),
                       ("InternLM", "internlm"), ("llm-foundry", "mpt-llm-foundry")):
        if key in source:
            return short
    return source[:30]


def _int(value: str, default: int | None = None) -> int | None:
    value = (value or "").strip()
    if not value:
        return default
    return int(float(value))


def _precision(notes: str) -> str:
    m = re.match(r"precision=([^;,(]+)", notes)
    text = (m.group(1) if m else "").lower()
    if "fp8" in text or "float8" in text:
        return "fp8"
    if "fp16" in text and "bf16" not in text:
        return "fp16"
    return "bf16"


def _zero(text: str, fsdp_hint: bool) -> int:
    t = text.lower()
    if "zero-3" in t or "full_shard" in t or "fsdp" in t or fsdp_hint:
        return 3
    if "distributed optimizer" in t or "zero-1" in t:
        return 1
    if "none" in t:
        return 0
    return 1


def _recompute(text: str) -> str:
    t = text.lower()
    if t.startswith("full"):
        return "full"
    if t.startswith("selective"):
        return "selective"
    return "none"


def _model(row: dict) -> ModelSpec:
    h, L, f = _int(row["hidden"]), _int(row["n_layers"]), _int(row["ffn_hidden"])
    a, kv, V = _int(row["n_heads"]), _int(row["n_kv_heads"]), _int(row["vocab"], 51200)
    if not all((h, L, f, a)):
        raise PartitaError("architecture not given (hidden/layers/ffn/heads blank)")
    name = row["model_name"]
    gpt = name.lower().startswith(("gpt", "mpt"))
    nemotron = "nemotron" in name.lower()
    act = "gelu" if gpt else ("relu2" if nemotron else "swiglu")
    return ModelSpec(name=name, hidden=h, layers=L, heads=a, kv_heads=kv or a, ffn_hidden=f, vocab=V,
                     activation=act, norm="layernorm" if gpt or nemotron else "rmsnorm",
                     tied_embeddings=gpt, position="learned" if name.lower().startswith("gpt") else "rope",
                     max_positions=_int(row["seq_len"], 2048) or 2048, dropout=name.lower().startswith("gpt-"),
                     source="published_runs.csv").validated(name)


def megatron_hw_flops(model: ModelSpec, gbs: int, seq: int) -> float:
    """``96 B s l h^2 (1 + s/6h + V/16lh)``: FLOPs per step incl. the recomputed forward."""
    h, L, V = model.hidden, model.layers, model.vocab
    return 96 * gbs * seq * L * h * h * (1 + seq / (6 * h) + V / (16 * L * h))


def megatron_model_flops(model: ModelSpec, gbs: int, seq: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` (2024): model FLOPs per step."""
    h, L, V = model.hidden, model.layers, model.vocab
    gated = 1.5 if model.gated else 1.0
    attn = 1 + model.kv_heads / model.heads + seq / h
    return 12 * gbs * seq * L * h * h * (attn + model.ffn_hidden / h * gated) + 6 * gbs * seq * h * V


def load_cases(csv_path: str | Path) -> tuple[list[Case], list[tuple[str, str]]]:
    """All rows that can be predicted, and (row description, reason) for the ones skipped."""
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        label = f"{short_source(row['source'])}: {row['model_name']} on {row['n_devices']} {row['hardware'].split()[0]}"
        try:
            cases.append(_case(row))
        except PartitaError as e:
            skipped.append((label, str(e)))
    return cases, skipped


def _case(row: dict) -> Case:
    source = short_source(row["source"])
    hw_token = row["hardware"].split()[0]
    if hw_token not in HARDWARE:
        raise PartitaError(f"hardware {hw_token} not in the catalog")
    n = _int(row["n_devices"])
    tp, pp = _int(row["tp"]), _int(row["pp"])
    if tp is None or pp is None:
        raise PartitaError("parallel layout (tp/pp) not stated")
    model = _model(row)
    cp = _int(row["cp"], 1) or 1
    vpp = _int(row["vpp"], 1) or 1
    seq = _int(row["seq_len"])
    if not seq and source.startswith("torchtitan"):
        seq = 8192  # torchtitan's llama3 training configs default to seq_len 8192 (as the row's notes say)
    if not seq:
        raise PartitaError("sequence length not stated")
    dp = n // (tp * pp * cp)
    mbs = _int(row["micro_batch"], 1) or 1
    gbs = _int(row["global_batch"])
    if not gbs:
        raise PartitaError("global batch not stated")
    sp_text = row["sequence_parallel"].strip().lower()
    sp = (sp_text == "y") if sp_text else tp > 1
    zero = _zero(row["zero_stage/fsdp"], source in ("mpt-llm-foundry",))
    nemo = source in ("nemo-24.07", "dgxc-25.04")
    split = balanced_split(model.layers, pp * vpp) if model.layers % (pp * vpp) else None
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, layer_split=split, sp=sp and tp > 1, zero=zero, mbs=mbs, gbs=gbs, seq_len=seq,
                recompute=_recompute(row["recompute"]), dtype=_precision(row["notes"]),
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b",
                grad_dtype="bf16" if nemo else "fp32",
                tp_comm_overlap=nemo or source == "megatron-readme-h100")
    cluster = make_cluster(HARDWARE[hw_token], n)
    errs = validate(plan, model, n)
    if errs:
        raise PartitaError("layout not expressible: " + "; ".join(errs))
    metric, value = row["measured_metric"], float(row["measured_value"])
    tokens = gbs * seq
    if metric == "iter_time_s":
        measured, kind = value, "step_time_s"
    elif metric == "tokens_per_s_per_gpu":
        measured, kind = tokens / (value * n), "step_time_s"
    elif metric == "tflops_per_gpu":
        flops = megatron_model_flops(model, gbs, seq) if source == "megatron-readme-h100" else megatron_hw_flops(model, gbs, seq)
        measured, kind = flops / (value * 1e12 * n), "step_time_s"
    elif metric == "mfu_pct":
        measured = megatron_model_flops(model, gbs, seq) / (value / 100 * 989e12 * n)
        kind = "step_time_s"
    elif metric == "peak_mem_gib":
        measured, kind = value, "peak_memory_gib"
    else:
        raise PartitaError(f"metric {metric} not compared")
    return Case(source=source, name=row["model_name"], model=model, cluster=cluster, plan=plan, metric=kind,
                measured=measured, raw_metric=metric, raw_value=value)
