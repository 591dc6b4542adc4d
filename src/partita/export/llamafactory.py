"""A LLaMA-Factory training YAML for a plan (issue 36 item 4): ``llamafactory-cli train`` runs it.

Keys are LLaMA-Factory's own (hiyouga/LLaMA-Factory@ff6d4d1 src/llamafactory/hparams/, checked
against that field list in tests/export_oracles/llamafactory_fields.json, and the Hugging Face
``Seq2SeqTrainingArguments`` it extends against transformers itself). :mod:`partita.imports.llamafactory`
reads the file back: the round trip keeps the plan's fine-tuning fields, batch, length, dtype, ZeRO
stage and recompute.

LLaMA-Factory trains data parallel only (the Hugging Face Trainer: DDP, DeepSpeed ZeRO, FSDP), so a
plan with tp, pp, cp or ep is refused in one line, as are ZeRO-1 (LLaMA-Factory ships DeepSpeed presets
for ZeRO 0, 2 and 3 only: examples/deepspeed/ds_z{0,2,3}_config.json; ZeRO-0 is written as plain DDP)
and fp8. Its gradient checkpointing recomputes whole layers: ``recompute full`` of every layer is
``disable_gradient_checkpointing: false`` (its default), ``none`` is ``true``; selective or partial
recompute has no key (refused).
"""
from __future__ import annotations

from ..errors import PartitaError
from ..plan import Plan
from .context import ExportContext
from .result import Export

#: ZeRO stage -> the DeepSpeed preset LLaMA-Factory ships (launch directory: its repository root).
DS_PRESETS = {2: "examples/deepspeed/ds_z2_config.json", 3: "examples/deepspeed/ds_z3_config.json"}


def _check_expressible(plan: Plan) -> None:
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(plan, name) > 1:
            raise PartitaError(f"{name}={getattr(plan, name)}: LLaMA-Factory trains data parallel only (the Hugging "
                               f"Face Trainer: DDP, DeepSpeed ZeRO, FSDP); re-plan with --{name} 1 or export to "
                               "megatron / mindspeed")
    if plan.zero == 1:
        raise PartitaError("zero=1: LLaMA-Factory ships DeepSpeed presets for ZeRO 0, 2 and 3 only "
                           "(examples/deepspeed/ds_z{0,2,3}_config.json); re-plan with --zero 0, 2 or 3")
    if plan.dtype == "fp8":
        raise PartitaError("dtype fp8: export a bf16 plan to LLaMA-Factory (its fp8 path is a separate "
                           "DeepSpeed/Accelerate setup this export does not write)")
    if plan.optimizer_offload:  # the ZeRO presets above keep the optimizer states on the device
        raise PartitaError(f"optimizer_offload={plan.optimizer_offload:g}: this export writes LLaMA-Factory's ZeRO "
                           "presets, which keep the optimizer states on the device; re-plan without it, or export "
                           "--to deepspeed (zero_optimization.offload_optimizer)")
    if plan.moment_dtype != "fp32" and plan.zero == 2:  # priced at zero 1-2 (cost/states.moment_saving)
        raise PartitaError(f"moment_dtype={plan.moment_dtype}: the Hugging Face Trainer's AdamW under DeepSpeed keeps "
                           "fp32 moments beside the fp32 master; re-plan with --moment-dtype fp32")
    if plan.recompute == "selective" or plan.recompute_layers:
        raise PartitaError(f"recompute {plan.recompute}{f' of {plan.recompute_layers} layers' if plan.recompute_layers else ''}: "
                           "LLaMA-Factory's gradient checkpointing recomputes every layer (recompute full) or none")


def _method(plan: Plan) -> list[str]:
    """The ``### method`` lines: stage, fine-tuning type, LoRA settings, the DeepSpeed preset."""
    from ..imports.finetune import HF_NAMES
    lines = [f"stage: {'pt' if plan.finetune == 'none' else 'sft'}", "do_train: true",
             f"finetuning_type: {'lora' if plan.finetune == 'lora' else 'full'}"]
    if plan.finetune == "lora":
        alpha = int(plan.lora_alpha) if float(plan.lora_alpha).is_integer() else plan.lora_alpha
        lines += [f"lora_rank: {plan.lora_rank}", f"lora_alpha: {alpha}", f"lora_target: {HF_NAMES[plan.lora_targets]}"]
        if plan.lora_dropout:
            lines.append(f"lora_dropout: {plan.lora_dropout:g}")
    if plan.zero in DS_PRESETS:
        lines.append(f"deepspeed: {DS_PRESETS[plan.zero]}")
    return lines


def export_llamafactory(ctx: ExportContext) -> Export:
    """The YAML of ``ctx.plan`` (module docstring); the model path is the model's name (or a placeholder)."""
    plan = ctx.plan
    _check_expressible(plan)
    warnings = []
    if plan.lora_alpha != int(plan.lora_alpha):
        warnings.append(f"lora_alpha {plan.lora_alpha}: LLaMA-Factory's lora_alpha is an integer")
    model = ctx.model.name if ctx.model is not None else "your/model"
    if ctx.model is None:
        warnings.append("no --model: model_name_or_path is a placeholder (your/model)")
    lines = ["# written by partita export --to llamafactory; launch on the plan's "
             f"{plan.world_size} devices:",
             "#   FORCE_TORCHRUN=1 NNODES=<nodes> NPROC_PER_NODE=<devices per node> llamafactory-cli train THIS.yaml",
             "### model", f"model_name_or_path: {model}", "", "### method", *_method(plan), "",
             "### dataset", "dataset: alpaca_en_demo  # your dataset (data/dataset_info.json)", "template: default",
             f"cutoff_len: {plan.seq_len}", "", "### train",
             f"per_device_train_batch_size: {plan.mbs}", f"gradient_accumulation_steps: {plan.grad_accum}"]
    lines += {"bf16": ["bf16: true"], "fp16": ["fp16: true"]}.get(plan.dtype, [])
    lines.append(f"disable_gradient_checkpointing: {'true' if plan.recompute == 'none' else 'false'}")
    lines.append("output_dir: saves/partita")
    return Export("llamafactory", "\n".join(lines) + "\n", warnings,
                  data={"yaml_keys": [line.split(":", 1)[0] for line in lines if line and not line.startswith("#")
                                      and ":" in line]})
