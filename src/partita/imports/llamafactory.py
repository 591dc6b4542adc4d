"""A LLaMA-Factory training YAML (``llamafactory-cli train x.yaml``) read into a plan (issue 36 item 4).

LLaMA-Factory runs the Hugging Face Trainer: data parallel only - torch DDP, DeepSpeed ZeRO through
the ``deepspeed:`` config it names, or FSDP. What is read, with the defaults its argument dataclasses
give where the file is silent (hiyouga/LLaMA-Factory@ff6d4d1 src/llamafactory/hparams/; the field list
is tests/export_oracles/llamafactory_fields.json):

- ``stage`` (``sft``) and ``finetuning_type`` (``lora``): LoRA -> ``finetune lora`` with ``lora_rank`` (8),
  ``lora_alpha`` (unset: ``lora_rank * 2``, FinetuningArguments.__post_init__) and ``lora_target``
  (``all``: every linear but the output layer, ``find_all_linear_modules``), ``lora_dropout`` (0);
  ``full`` -> ``finetune
  full`` (``none`` under ``stage: pt``); ``freeze`` / ``oft`` and the preference stages (rm, ppo, dpo,
  kto) are named as not modelled;
- ``per_device_train_batch_size`` (Hugging Face's default 8) and ``gradient_accumulation_steps`` (1);
  the global batch is their product times the data-parallel ranks;
- ``cutoff_len`` (2048) is the sequence length; without ``packing`` the collator pads each batch to
  its longest sample only (named: the estimate is at ``cutoff_len``);
- ``bf16`` / ``fp16`` / ``pure_bf16``, else fp32;
- gradient checkpointing is on unless ``disable_gradient_checkpointing: true`` (model_args.py; the
  Trainer checkpoints every decoder layer: ``recompute full``);
- ``deepspeed``: the ds_config it names, resolved as LLaMA-Factory does - relative to the directory it
  is launched from, which for its examples is the repository root: the YAML's directory and then each
  parent is tried; its ``"auto"`` values are filled from the YAML as the Trainer fills them; ``fsdp``
  (``full_shard`` / ``shard_grad_op``) is ZeRO-3 / ZeRO-2; neither: DDP, ZeRO-0.

The YAML holds no world size (``llamafactory-cli`` uses every visible device, or ``FORCE_TORCHRUN`` with
``NNODES`` x ``NPROC_PER_NODE``): ``--devices``, or ``--env NPROC_PER_NODE=8 --env NNODES=2``. Its files
are flat ``key: value`` maps; nested blocks (``gradient_checkpointing_kwargs:``) are skipped, so no
YAML library is needed.
"""
from __future__ import annotations

import os
import re
from typing import Any

from ..errors import PartitaError
from ..plan import Plan
from .yaml_file import read_yaml_mapping

#: A top-level ``key: value`` line (the value may be empty: a nested block follows).
#: Keys only a LLaMA-Factory training YAML has together (detection).
MARKERS = re.compile(r"^(stage|finetuning_type|cutoff_len|lora_target)\s*:", re.MULTILINE)
#: LLaMA-Factory v1's configs (examples/v1/: ``peft_config:`` / ``dist_config:`` blocks), not this format.
V1_KEYS = ("peft_config", "dist_config", "kernel_config", "model_class")
#: Settings that change memory or time that the plan does not hold (key, value test, what it changes).
NOT_MODELLED: tuple[tuple[str, Any, str], ...] = (
    ("quantization_bit", lambda v: v not in (None, False), "the frozen base weights quantized (QLoRA): less weight "
                                                          "memory than estimated"),
    ("use_dora", lambda v: v is True, "DoRA: a magnitude vector and a norm per adapted linear"),
    ("use_galore", lambda v: v is True, "GaLore: low-rank optimizer states"),
    ("use_apollo", lambda v: v is True, "APOLLO: low-rank optimizer states"),
    ("use_badam", lambda v: v is True, "BAdam: one block of layers trained at a time"),
    ("use_adam_mini", lambda v: v is True, "Adam-mini: one second-moment value per block"),
    ("use_muon", lambda v: v is True, "Muon: one momentum state, not Adam's two"),
    ("use_kt", lambda v: v is True, "KTransformers: MoE experts computed on the CPU"),
    ("enable_liger_kernel", lambda v: v is True, "Liger fused kernels (less activation memory)"),
    ("use_unsloth", lambda v: v is True, "Unsloth kernels and offloaded checkpoints"),
    ("mixture_of_depths", lambda v: v not in (None, False), "mixture of depths: tokens skip layers"),
    ("use_llama_pro", lambda v: v is True, "LLaMA Pro: only the expanded blocks trained"),
)
#: LLaMA-Factory's stages and fine-tuning types (FinetuningArguments' Literal choices).
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
FINETUNING_TYPES = ("lora", "oft", "freeze", "full")


def is_llamafactory(path: str, text: str) -> bool:
    """Whether ``path`` is a LLaMA-Factory training YAML."""
    return path.endswith((".yaml", ".yml")) and bool(MARKERS.search(text))


def read_yaml(text: str, path: str) -> dict[str, Any]:
    """The training file's keys as LLaMA-Factory reads them (``yaml.safe_load``)."""
    return read_yaml_mapping(text, path, "a LLaMA-Factory training file")


def _whole(cfg: dict[str, Any], key: str, default: int, path: str) -> int:
    value = cfg.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PartitaError(f"{path}: {key} {value!r} must be a whole number from 1")
    return value


def world_from_env(env: dict[str, str]) -> int | None:
    """``NPROC_PER_NODE`` x ``NNODES`` (``--env``, as ``FORCE_TORCHRUN`` launches), else None."""
    if "NPROC_PER_NODE" not in env:
        return None
    per_node, nodes = env["NPROC_PER_NODE"], env.get("NNODES", "1")
    if not (per_node.isdigit() and nodes.isdigit()) or int(per_node) * int(nodes) < 1:
        raise PartitaError(f"--env NPROC_PER_NODE={per_node} NNODES={nodes}: give whole numbers from 1")
    return int(per_node) * int(nodes)


def _finetune(cfg: dict[str, Any], path: str) -> tuple[dict[str, Any], list[str]]:
    """(the plan's fine-tuning fields, notes) of ``stage`` and ``finetuning_type`` (module docstring)."""
    stage, kind = cfg.get("stage") or "sft", cfg.get("finetuning_type") or "lora"
    if stage not in STAGES or kind not in FINETUNING_TYPES:
        raise PartitaError(f"{path}: stage {stage!r} / finetuning_type {kind!r}: LLaMA-Factory's are "
                           f"{', '.join(STAGES)} / {', '.join(FINETUNING_TYPES)}")
    notes = [] if stage in ("pt", "sft") else [f"stage {stage}: a preference or reward stage (reference model, "
                                               "pairs of sequences), estimated as supervised training"]
    if kind == "lora":
        from .finetune import lora_targets
        rank = _whole(cfg, "lora_rank", 8, path)
        targets, note = lora_targets([str(cfg.get("lora_target") or "all")], "lora_target")
        alpha = cfg.get("lora_alpha") or rank * 2
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
            raise PartitaError(f"{path}: lora_alpha {alpha!r} must be a positive number")
        dropout = cfg.get("lora_dropout") or 0.0
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise PartitaError(f"{path}: lora_dropout {dropout!r} must be a dropout probability, from 0 to below 1")
        return ({"finetune": "lora", "lora_rank": rank, "lora_alpha": float(alpha), "lora_targets": targets,
                 "lora_dropout": float(dropout)}, notes + ([note] if note else []))
    if kind in ("freeze", "oft"):
        notes.append(f"finetuning_type {kind}: part of the weights trained ({kind}), estimated with every weight "
                     "trained")
    return ({"finetune": "full"} if stage != "pt" else {}), notes


def _dtype(cfg: dict[str, Any]) -> str:
    """fp8 (``fp8: true``: torchao / Transformer Engine linears through Accelerate), bf16, fp16 or fp32."""
    if cfg.get("fp8"):
        return "fp8"
    return "bf16" if cfg.get("bf16") or cfg.get("pure_bf16") else "fp16" if cfg.get("fp16") else "fp32"


def _ds_file(value: str, yaml_path: str) -> str:
    """The ds_config ``deepspeed:`` names: absolute, else relative to the YAML's directory or a parent
    of it (LLaMA-Factory resolves it from the launch directory, its repository root for its examples)."""
    if os.path.isabs(value):
        candidates = [value]
    else:
        here = os.path.dirname(os.path.abspath(yaml_path))
        candidates = []
        while True:
            candidates.append(os.path.join(here, value))
            parent = os.path.dirname(here)
            if parent == here:
                break
            here = parent
    for file in candidates:
        if os.path.isfile(file):
            return file
    raise PartitaError(f"{yaml_path}: deepspeed {value} not found next to the YAML or in a directory above it "
                       "(give its path, or run from where llamafactory-cli runs)")


def plan_from_llamafactory(path: str, text: str, world: int | None, fill: dict[str, Any] | None = None
                           ) -> tuple[Plan, tuple[str, ...]]:
    """(the plan, the settings named as not modelled) of a LLaMA-Factory YAML on ``world`` ranks."""
    from . import deepspeed
    cfg = read_yaml(text, path)
    if any(key in cfg for key in V1_KEYS):
        raise PartitaError(f"{path}: a LLaMA-Factory v1 config ({', '.join(k for k in V1_KEYS if k in cfg)}): not read; "
                           "give the v0 YAML (stage, finetuning_type, lora_rank, deepspeed ...)")
    if world is None:
        raise PartitaError(f"{path}: a LLaMA-Factory YAML does not say how many devices it runs on (llamafactory-cli "
                           "uses every visible one): pass --devices, or --env NPROC_PER_NODE=8 --env NNODES=2")
    fields, notes = _finetune(cfg, path)
    notes += [f"{key} {cfg[key]}: {what}" for key, on, what in NOT_MODELLED if on(cfg.get(key))]
    if re.search(r"awq|gptq|aqlm|hqq|eetq|int4|int8|bnb-4bit", str(cfg.get("model_name_or_path", "")), re.IGNORECASE):
        notes.append(f"model_name_or_path {cfg['model_name_or_path']}: a quantized checkpoint (frozen base weights in "
                     "fewer bits than estimated)")
    mbs = _whole(cfg, "per_device_train_batch_size", 8, path)  # transformers TrainingArguments' default
    gas = _whole(cfg, "gradient_accumulation_steps", 1, path)
    seq_len, dtype = _whole(cfg, "cutoff_len", 2048, path), _dtype(cfg)
    recompute = "none" if cfg.get("disable_gradient_checkpointing") else "full"
    if not cfg.get("packing") and not cfg.get("neat_packing"):
        notes.append(f"cutoff_len {seq_len}: each batch is padded to its longest sample only (estimated at cutoff_len)")
    if cfg.get("deepspeed"):
        from ..inputs import read_json
        file = _ds_file(str(cfg["deepspeed"]), path)
        ds = read_json(file, "DeepSpeed config")
        if not isinstance(ds, dict):
            raise PartitaError(f"{file} must hold a JSON object (a DeepSpeed config)")
        ds = _filled(ds, mbs, gas, world, dtype)
        deepspeed.check_ds_config(file, ds)
        plan = deepspeed.plan_from_ds_config(ds, world, seq_len, None, fill, file)
        notes = list(deepspeed.ds_not_modelled(ds)) + notes
    else:
        fsdp = " ".join(map(str, cfg["fsdp"])) if isinstance(cfg.get("fsdp"), list) else str(cfg.get("fsdp") or "")
        zero = 3 if "full_shard" in fsdp else 2 if "shard_grad_op" in fsdp else 0
        plan = Plan(dp=world, zero=zero, mbs=mbs, gbs=mbs * gas * world, seq_len=seq_len, dtype=dtype,
                    framework="partita")
    return plan.with_(recompute=recompute, **fields), tuple(notes)


def _filled(ds: dict[str, Any], mbs: int, gas: int, world: int, dtype: str) -> dict[str, Any]:
    """The ds_config with the ``"auto"`` values the Hugging Face Trainer fills (its
    ``HfTrainerDeepSpeedConfig.trainer_config_process``: micro-batch, accumulation, their product times
    the world, ``bf16`` / ``fp16`` from the training arguments)."""
    out = dict(ds)
    for key, value in (("train_micro_batch_size_per_gpu", mbs), ("gradient_accumulation_steps", gas),
                       ("train_batch_size", mbs * gas * world)):
        if out.get(key) == "auto":
            out[key] = value
    for key in ("bf16", "fp16"):
        if isinstance(out.get(key), dict) and out[key].get("enabled") == "auto":
            out[key] = dict(out[key], enabled=dtype == key)
    return out
