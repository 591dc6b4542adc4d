"""OpenRLHF's supervised and preference trainers (``deepspeed --module openrlhf.cli.train_sft`` /
``train_rm`` / ``train_dpo``) read as the DeepSpeed config they build.

OpenRLHF's example scripts keep the command line in a here-document (``read -r -d '' cmd <<EOF``)
and launch ``deepspeed --module $cmd``; the shell reader (:mod:`.shell`) follows that. The trainer
builds its ds_config from its own flags (OpenRLHF/OpenRLHF@3c3be62 openrlhf/cli/train_sft.py argument
defaults; openrlhf/utils/deepspeed/deepspeed_utils.py ``get_train_ds_config`` and deepspeed.py
``get_ds_train_config``): ZeRO stage ``--ds.zero_stage`` (2), precision ``--ds.param_dtype`` (bf16),
the optimizer on the host with ``--ds.adam_offload``, ``train_micro_batch_size_per_gpu`` =
``--train.micro_batch_size`` (8), ``train_batch_size`` = ``--train.batch_size`` (128); the sequence
length is ``--data.max_len`` (2048); ``--model.gradient_checkpointing_enable`` checkpoints every
decoder layer (Hugging Face's gradient checkpointing: recompute full); ``--ds.lora.rank`` > 0 is LoRA
(``--ds.lora.alpha`` 16, ``--ds.lora.target_modules`` all-linear).

Read only where it is exact: DeepSpeed AutoTP (``--ds.tensor_parallel_size``) and ring attention
(``--ds.ring_attn_size``) change how ranks divide the batch (OpenRLHF multiplies ``train_batch_size``
by both), and the older underscore flags (``--micro_train_batch_size``, ``--zero_stage``) are another
parser; each is refused in one line. The PPO / GRPO trainer (``train_ppo_ray``) is an RL job, named
by :mod:`.detect`.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import PartitaError

#: The trainers read here (``openrlhf.cli.train_ppo_ray`` is not one of them).
TRAINER = re.compile(r"(?:^|[\s/.])openrlhf\.cli\.(train_sft|train_rm|train_dpo)\b")
_OLD_STYLE = ("--micro_train_batch_size", "--train_batch_size", "--zero_stage", "--max_len")
#: OpenRLHF's argument defaults (train_sft.py / train_dpo.py / train_rm.py).
_DEFAULTS = {"--ds.zero_stage": "2", "--ds.param_dtype": "bf16", "--train.micro_batch_size": "8",
             "--train.batch_size": "128", "--data.max_len": "2048", "--ds.lora.rank": "0", "--ds.lora.alpha": "16",
             "--ds.tensor_parallel_size": "1", "--ds.ring_attn_size": "1"}
#: flag -> what it changes that Partita does not model.
_NOT_MODELLED = {
    "--ds.packing_samples": "samples packed into one sequence per micro-batch (tokens per step vary; estimated "
                            "at micro_batch_size x max_len)",
    "train_dpo": "DPO: a frozen reference model and chosen + rejected sequences per sample (estimated as "
                 "supervised training of the policy alone)",
    "train_rm": "a reward model: the LM head replaced by a value head, chosen + rejected sequences per sample",
    "--ds.load_in_4bit": "the frozen base weights in 4 bits (QLoRA): less weight memory than estimated",
}


def is_openrlhf(text: str) -> bool:
    """Whether ``text`` launches one of OpenRLHF's SFT / RM / DPO trainers."""
    return bool(TRAINER.search(text))


def trainer_argv(commands: list[list[str]], path: str) -> tuple[list[str], list[str], str]:
    """(the launcher's words, the trainer's flags, the trainer's name) of the command that runs it."""
    for argv in reversed(commands):
        for k, word in enumerate(argv):
            found = TRAINER.search(" " + word)
            if found:
                return argv[:k], argv[k + 1:], found.group(1)
    raise PartitaError(f"{path}: no command runs openrlhf.cli.train_sft|train_rm|train_dpo")


def command_flags(argv: list[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` / a bare switch (``"true"``) of a trainer's command line
    (OpenRLHF's, DeepSpeed-Chat's main.py)."""
    out: dict[str, str] = {}
    for i, word in enumerate(argv):
        if not word.startswith("--"):
            continue
        name, eq, inline = word.partition("=")
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        out[name] = inline if eq else (nxt if nxt and not nxt.startswith("--") else "true")
    return out


def _whole(flags: dict[str, str], name: str, path: str) -> int:
    value = flags.get(name, _DEFAULTS[name])
    if not value.isdigit():
        raise PartitaError(f"{path}: {name} {value[:30]!r} must be a whole number (pass --env / --args for it)")
    return int(value)


def ds_config(argv: list[str], path: str) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """(the ds_config the trainer builds, the sequence length, the plan fields it sets beside it)."""
    flags = command_flags(argv)
    old = [f for f in _OLD_STYLE if f in flags]
    if old:
        raise PartitaError(f"{path}: {old[0]} is OpenRLHF's older flag spelling, not read here: write it as "
                           f"--{'train' if 'batch' in old[0] else 'ds' if 'zero' in old[0] else 'data'}."
                           f"{old[0][2:].replace('micro_train', 'micro').replace('train_', '')} (the dotted flags)")
    for name in ("--ds.tensor_parallel_size", "--ds.ring_attn_size"):
        if _whole(flags, name, path) > 1:
            raise PartitaError(f"{path}: {name} {flags[name]}: OpenRLHF then counts the batch over tp x ring ranks "
                               "(DeepSpeed AutoTP / ring attention), which Partita does not read from this trainer; "
                               "estimate it with partita estimate --tp / --cp")
    dtype = flags.get("--ds.param_dtype", _DEFAULTS["--ds.param_dtype"])
    cfg = {"train_micro_batch_size_per_gpu": _whole(flags, "--train.micro_batch_size", path),
           "train_batch_size": _whole(flags, "--train.batch_size", path),
           "zero_optimization": {"stage": _whole(flags, "--ds.zero_stage", path),
                                 "offload_optimizer": {"device": "cpu" if "--ds.adam_offload" in flags else "none"}},
           "bf16": {"enabled": dtype == "bf16"}, "fp16": {"enabled": dtype == "fp16"}, "gradient_clipping": 1.0}
    rank = _whole(flags, "--ds.lora.rank", path)
    fields: dict[str, Any] = {"recompute": "full" if "--model.gradient_checkpointing_enable" in flags else "none",
                              "finetune": "lora" if rank else "full"}
    if rank:
        from .finetune import lora_targets
        targets = flags.get("--ds.lora.target_modules", "all-linear")
        fields.update(lora_rank=rank, lora_alpha=float(flags.get("--ds.lora.alpha", "16")),
                      lora_targets=lora_targets(targets.split(), "--ds.lora.target_modules")[0])
    return cfg, _whole(flags, "--data.max_len", path), fields


def not_modelled(argv: list[str], trainer: str) -> tuple[str, ...]:
    """``"name: what it changes"`` for what the command line runs that Partita does not model."""
    flags = command_flags(argv)
    found = [f"{name}: {_NOT_MODELLED[name]}" for name in ("--ds.packing_samples", "--ds.load_in_4bit")
             if name in flags]
    return tuple(([f"{trainer}: {_NOT_MODELLED[trainer]}"] if trainer in _NOT_MODELLED else []) + found)


def model_note(argv: list[str]) -> str:
    """Why the model is not read: the trainer loads it by name (``--model.model_name_or_path``)."""
    name = command_flags(argv).get("--model.model_name_or_path", "(none)")
    return f"the script names the model {name}: pass --model (a preset or its config.json)"
