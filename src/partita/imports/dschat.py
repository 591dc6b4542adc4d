"""DeepSpeed-Chat's training scripts (``deepspeed main.py --model_name_or_path ... --zero_stage N``,
deepspeedai/DeepSpeedExamples applications/DeepSpeed-Chat) read as the DeepSpeed config ``main.py``
builds from its flags.

Facts from DeepSpeedExamples@45b4b71 (applications/DeepSpeed-Chat/):

- training/step1_supervised_finetuning/main.py ``parse_args``: ``--per_device_train_batch_size`` 16,
  ``--max_seq_len`` 512, ``--gradient_accumulation_steps`` 1, ``--dtype`` fp16 (choices fp16, bf16),
  ``--zero_stage`` 0, ``--offload`` off, ``--lora_dim`` 0 (no LoRA), ``--gradient_checkpointing`` off;
  the same defaults in step2_dpo_finetuning/main.py and step2_reward_model_finetuning/main.py;
- main.py: ``train_micro_batch_size_per_gpu`` = ``--per_device_train_batch_size``, ``train_batch_size`` =
  that x the world size x ``--gradient_accumulation_steps``;
- dschat/utils/ds_utils.py ``get_train_ds_config``: ZeRO stage ``--zero_stage``, ``overlap_comm`` true; with ``--offload`` both
  ``offload_optimizer`` and ``offload_param`` on the CPU; fp16 or bf16 enabled by ``--dtype``;
- dschat/utils/module/lora.py: ``LinearLayer_LoRA`` freezes the replaced linear's weight (l.49,
  ``self.weight.requires_grad = False``) for the linears whose name holds ``--lora_module_name``, with
  adapters of rank ``--lora_dim`` and scale ``lora_scaling / lora_dim`` (``lora_scaling`` 1); everything
  else (embeddings, norms, the output layer) still trains unless ``--only_optimize_lora`` (named: LoRA in
  Partita freezes every base weight);
- ``--gradient_checkpointing``: Hugging Face's, every decoder layer (recompute full).

Step 3 (RLHF: ``--actor_model_name_or_path``, an actor, a critic, a reference and a reward model in one
job) is refused in one line; step 2 (DPO, reward model) is named from the script's directory.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import PartitaError
from .openrlhf import command_flags

#: ``main.py`` with DeepSpeed-Chat's own flags (``--model_name_or_path`` or the actor's, and one of its others).
_MAIN = re.compile(r"\bmain\.py\b")
_FLAGS = re.compile(r"--(?:data_split|per_device_train_batch_size|zero_stage|lora_dim|actor_zero_stage)\b")
_MODEL = re.compile(r"--(?:actor_)?model_name_or_path\b")
#: main.py's argument defaults (step1 / step2 parse_args)
_DEFAULTS = {"--per_device_train_batch_size": "16", "--max_seq_len": "512", "--gradient_accumulation_steps": "1",
             "--dtype": "fp16", "--zero_stage": "0", "--lora_dim": "0"}
#: a directory of DeepSpeed-Chat's that names the stage -> what it changes that Partita does not model
_STAGES = {
    "step2_dpo": "DPO: a frozen reference model and chosen + rejected sequences per sample (estimated as "
                 "supervised training of the policy alone)",
    "step2_reward": "a reward model: the LM head replaced by a value head, chosen + rejected sequences per sample",
}
PARTIAL_LORA = ("--lora_dim without --only_optimize_lora: the embeddings, norms, output layer and linears outside "
                "--lora_module_name keep training (more gradient and optimizer memory than estimated)")


def is_dschat(text: str) -> bool:
    """Whether ``text`` launches DeepSpeed-Chat's ``main.py`` (its flags, not another trainer's)."""
    return bool(_MAIN.search(text) and _FLAGS.search(text) and _MODEL.search(text))


def trainer_argv(commands: list[list[str]], path: str) -> tuple[list[str], list[str]]:
    """(the launcher's words, main.py's flags) of the last command that runs ``main.py``."""
    for argv in reversed(commands):
        for k, word in enumerate(argv):
            if word.endswith("main.py"):
                return argv[:k], argv[k + 1:]
    raise PartitaError(f"{path}: no command runs DeepSpeed-Chat's main.py")


def _whole(flags: dict[str, str], name: str, path: str) -> int:
    value = flags.get(name, _DEFAULTS[name])
    if not value.isdigit():
        raise PartitaError(f"{path}: {name} is {value[:30]!r}, not a whole number (an unset variable or positional "
                           "argument of the script: --args or --env sets it)")
    return int(value)


def check_trainer(argv: list[str], path: str) -> None:
    """A one-line refusal of step 3 (RLHF), whatever the device count."""
    if "--actor_model_name_or_path" in command_flags(argv):
        raise PartitaError(f"{path}: DeepSpeed-Chat step 3 (RLHF: actor, critic, reference and reward models in one "
                           "job) is not a layout Partita reads; estimate the actor's training with partita estimate "
                           "--model M --devices N --zero Z --mbs B --global-batch G")


def ds_config(argv: list[str], world: int, path: str) -> tuple[dict[str, Any], int, dict[str, Any]]:
    """(the ds_config main.py builds, the sequence length, the plan fields it sets beside it)."""
    flags = command_flags(argv)
    check_trainer(argv, path)
    dtype = flags.get("--dtype", _DEFAULTS["--dtype"])
    if dtype not in ("fp16", "bf16"):
        raise PartitaError(f"{path}: --dtype {dtype[:20]!r}: DeepSpeed-Chat's main.py takes fp16 or bf16")
    stage = _whole(flags, "--zero_stage", path)
    if stage > 3:
        raise PartitaError(f"{path}: --zero_stage {stage}: DeepSpeed's ZeRO stages are 0-3")
    mbs = _whole(flags, "--per_device_train_batch_size", path)
    offload = "cpu" if "--offload" in flags else "none"
    cfg = {"train_micro_batch_size_per_gpu": mbs,
           "train_batch_size": mbs * world * _whole(flags, "--gradient_accumulation_steps", path),
           "zero_optimization": {"stage": stage, "overlap_comm": True, "offload_optimizer": {"device": offload},
                                 "offload_param": {"device": offload}},
           dtype: {"enabled": True}, "gradient_clipping": 1.0}
    rank = _whole(flags, "--lora_dim", path)
    fields: dict[str, Any] = {"recompute": "full" if "--gradient_checkpointing" in flags else "none",
                              "finetune": "lora" if rank else "full"}
    if rank:
        fields.update(lora_rank=rank, lora_alpha=1.0)  # scale lora_scaling / lora_dim, lora_scaling 1 (lora.py)
    return cfg, _whole(flags, "--max_seq_len", path), fields


def not_modelled(argv: list[str], path: str) -> tuple[str, ...]:
    """``"name: what it changes"`` for what the command line runs that Partita does not model."""
    flags = command_flags(argv)
    found = [f"{stage}: {what}" for stage, what in _STAGES.items() if stage in path.replace("\\", "/")]
    if flags.get("--lora_dim", "0") not in ("0", "") and "--only_optimize_lora" not in flags:
        found.append(PARTIAL_LORA)
    return tuple(found)


def model_note(argv: list[str]) -> str:
    """Why the model is not read: main.py loads it by name (``--model_name_or_path``)."""
    name = command_flags(argv).get("--model_name_or_path", "(none)")
    return f"the script names the model {name}: pass --model (a preset or its config.json)"
