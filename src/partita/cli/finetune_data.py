"""``--seq-lengths`` and ``--epochs`` of ``partita estimate`` and ``partita plan`` (issue 36):
the fine-tuning dataset's length distribution, what padding and packing make of the plan's
sequences, and the days for the dataset (:mod:`partita.cost.packing`)."""
from __future__ import annotations

import argparse
from typing import Any

from ..cost.packing import days_for, packing, read_seq_lengths
from .types import finite_float


def add_dataset_args(p: argparse.ArgumentParser) -> None:
    """The dataset flags (every command that estimates a plan)."""
    p.add_argument("--seq-lengths", metavar="FILE|SUMMARY",
                   help="fine-tuning data: a file of sample lengths in tokens (one per line, or JSONL) or a summary "
                        "p50=480,p90=1400[,mean=..][,samples=..]: print padding vs packing and days for the dataset "
                        "(the days columns then count the dataset's packed sequences, not --tokens)")
    p.add_argument("--epochs", type=finite_float(0, 1e6), default=1.0,
                   help="passes over the --seq-lengths dataset (default 1)")


def dataset_report(args: argparse.Namespace, est) -> dict[str, Any] | None:
    """The dataset block of an estimate (None without ``--seq-lengths``): tokens per epoch,
    padded and packed efficiency and sequences, steps and days for ``--epochs`` (packed, and
    padded one sample per sequence)."""
    if not getattr(args, "seq_lengths", None):
        return None
    data = read_seq_lengths(args.seq_lengths)
    pk = packing(data, est.plan.seq_len)
    epochs, gbs, step = args.epochs, est.plan.gbs, est.step_time_s
    return {"source": data.source, "samples": data.samples, "mean_tokens": data.mean, "epochs": epochs,
            "tokens_per_epoch": pk.tokens_per_epoch, "truncated_samples": pk.truncated,
            "padded_efficiency": pk.padded_efficiency, "packed_efficiency": pk.packed_efficiency,
            "packed_steps_per_epoch": pk.packed_sequences / gbs, "padded_steps_per_epoch": pk.padded_sequences / gbs,
            "packed_days": days_for(step, gbs, pk.packed_sequences, epochs),
            "padded_days": days_for(step, gbs, pk.padded_sequences, epochs),
            "attention_sample_len": attention_sample_len(data.lengths, est.plan.seq_len)}


def attention_sample_len(lengths, seq_len: int) -> int:
    """``sum L^2 / sum L`` over the samples (each cut to ``seq_len``): the value of
    ``--sample-len`` for packed sequences whose attention runs per sample (plan.py)."""
    cut = [min(int(n), seq_len) for n in lengths]
    return round(sum(n * n for n in cut) / max(1, sum(cut)))


def dataset_lines(report: dict[str, Any] | None) -> list[str]:
    """The dataset block as text lines."""
    if not report:
        return []
    r = report
    return [f"dataset ({r['source']}): {r['samples']:,} samples, {r['tokens_per_epoch']:.3g} tokens per epoch"
            + (f", {r['truncated_samples']:,.0f} truncated to the sequence" if r["truncated_samples"] else ""),
            f"  packed: {r['packed_efficiency']:.1%} of token slots used, {r['packed_steps_per_epoch']:,.0f} steps "
            f"per epoch, {r['packed_days']:.2f} days for {r['epochs']:g} epoch(s)",
            f"  padded (one sample per sequence): {r['padded_efficiency']:.1%} used, "
            f"{r['padded_steps_per_epoch']:,.0f} steps per epoch, {r['padded_days']:.2f} days",
            f"  attention per sample when packed: --sample-len {r['attention_sample_len']} (sum L^2 / sum L; "
            "docs/finetune.md)"]


def finetune_lines(est) -> list[str]:
    """One line for a fine-tuning plan: what it trains and what it keeps frozen ([] otherwise)."""
    if est.plan.finetune == "none" or getattr(est.model, "kind", "") == "traced":
        return []
    from ..cost.finetune import frozen_params, trainable_params
    trained, frozen = trainable_params(est.model, est.plan), frozen_params(est.model, est.plan)
    if est.plan.finetune == "full":
        return [f"full SFT: all {trained / 1e9:.2f} B parameters trained (memory and time as pre-training)"]
    p = est.plan
    return [f"LoRA r={p.lora_rank} alpha={p.lora_alpha:g} on {p.lora_targets}: {trained / 1e6:,.1f} M trainable "
            f"parameters ({trained / (trained + frozen):.2%}), {frozen / 1e9:.2f} B frozen (no gradients, no optimizer "
            "states; docs/finetune.md)"]


def dataset_tokens(args: argparse.Namespace, seq_len: int, tokens: float | None) -> float | None:
    """The token slots the run trains with ``--seq-lengths``: ``epochs x`` the packed
    sequences ``x seq_len``, so every "days" figure (``run_days``, the plan table's column)
    is the days for the dataset; ``tokens`` (``--tokens``) without it."""
    if not getattr(args, "seq_lengths", None):
        return tokens
    return args.epochs * packing(read_seq_lengths(args.seq_lengths), seq_len).packed_sequences * seq_len
