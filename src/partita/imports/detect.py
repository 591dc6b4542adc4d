"""Which framework a launch file is written for, and the file's text (every failure one line)."""
from __future__ import annotations

import re

from ..errors import PartitaError
from .swift import SWIFT_COMMAND, is_swift_trainer


def read_text(path: str) -> str:
    """The file's text, or a one-line error (missing, a directory, not UTF-8)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise PartitaError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise PartitaError(f"{path} is a directory; give the launch script or config file") from None
    except UnicodeDecodeError:
        raise PartitaError(f"{path} is not a UTF-8 text file (a launch script or config is expected)") from None
    except OSError as e:
        raise PartitaError(f"cannot read {path}: {e.strerror}") from None


#: What only a MindSpeed-LLM script has: its name, Ascend's toolkit or NPU count, MindSpeed's own flags
#: and MindSpeed-LLM's tokenizer type. Each of MindSpeed-LLM@c77308a's 99 examples/mcore pretrain/tune
#: scripts has one; none of Megatron-LM@d98e8a6's example scripts does (docs/import_megatron.md).
MINDSPEED_MARKERS = (r"mindspeed|ascend-toolkit|NPUS_PER_NODE|PretrainedFromHF|--use-ascend-mc2|--use-fused-rmsnorm|"
                     r"--use-fused-swiglu|--noop-layers|--num-layer-list|--reuse-fp32-param|--swap-attention|"
                     r"--swap-optimizer|--moe-fb-overlap|--schedules-method|--n-shared-experts|--first-k-dense-replace|"
                     r"--moe-alltoall-overlap-comm|--context-parallel-algo")


#: A torchtitan launch: its overrides, its entry point (``-m torchtitan.train``) or its TOML (``--job.config_file``).
_TITAN = r"--(parallelism|training)\.|torchtitan\.train\b|--job\.config[_-]file"


#: Trainers recognised but not read (their layouts are flags of their own, not a config Partita reads): the
#: refusal names the trainer and what gives Partita the same layout.
_NOT_READ = {
    r"openrlhf\.cli\.\w+": "an OpenRLHF RL command line ({}): PPO / GRPO run an actor, a rollout engine, a "
                            "reference and a critic in one job, not a layout Partita reads; estimate the actor's "
                            "training with partita estimate --model M --devices N --zero Z --mbs B --global-batch G",
    r"verl\.trainer\.fsdp_sft_trainer": "a verl FSDP fine-tuning command line ({}): its layout is Hydra overrides "
                                        "of its own (data.micro_batch_size_per_gpu, data.train_batch_size, "
                                        "ulysses_sequence_parallel_size), not read here: estimate it with partita "
                                        "estimate --model M --devices N --zero 3 --mbs B --global-batch G --seq-len L",
    r"verl\.trainer\.\w+": "a verl command line ({}): an RL job (actor, rollout engine, reference and critic in one "
                            "job) is not a layout Partita reads; estimate the actor's training layout with partita "
                            "estimate --model M --devices N --tp T --pp P (its actor_rollout_ref.actor.* settings)",
}


def detect(path: str, text: str) -> str:
    """The framework a file is written for, from its content (and a ``.json``/``.toml`` name)."""
    stripped = text.lstrip()
    from .flagscale import is_flagscale
    from .llamafactory import is_llamafactory
    if is_flagscale(path, text):  # FlagScale's Hydra YAML: Megatron-LM's flags in system/model/data (.flagscale)
        return "megatron"
    from .internevo import is_internevo
    if is_internevo(path, text):  # InternEvo's Python config (.internevo; read, never executed)
        return "internevo"
    from .nanotron import is_nanotron
    if path.endswith((".yaml", ".yml")) and is_nanotron(text):  # nanotron's Config tree (.nanotron)
        return "nanotron"
    if is_llamafactory(path, text):  # `stage:`, `finetuning_type:` ... in a .yaml: LLaMA-Factory's train config
        return "llamafactory"
    if stripped.startswith("{") or path.endswith(".json"):
        if re.search(r'"(zero_optimization|train_batch_size|train_micro_batch_size_per_gpu)"', text):
            return "deepspeed"
    if path.endswith(".toml") or re.search(_TITAN, text):
        return "torchtitan"
    if SWIFT_COMMAND.search(text):  # Megatron-SWIFT's `megatron sft`: Megatron-LM underneath (.swift)
        return "megatron"
    if is_swift_trainer(text):  # ms-swift's `swift sft --deepspeed X`: a ds_config underneath (.swift)
        return "deepspeed"
    from .openrlhf import is_openrlhf
    if is_openrlhf(text):  # OpenRLHF's SFT / RM / DPO trainers: the ds_config they build (.openrlhf)
        return "deepspeed"
    from .dschat import is_dschat
    if is_dschat(text):  # DeepSpeed-Chat's main.py: the ds_config it builds (.dschat)
        return "deepspeed"
    if re.search(MINDSPEED_MARKERS, text, re.IGNORECASE):
        return "mindspeed"
    # Megatron's entry points and forks' (pretrain_gpt.py, pretrain_mamba.py, Pai-Megatron-Patch's pretrain_qwen.py,
    # finetune_mcore_llama_withGA.py)
    if re.search(r"\b(?:(?:pre|post)train|finetune)_\w*\.py|--(?:tensor|pipeline)-model-parallel-size", text):
        return "megatron"
    for pattern, what in _NOT_READ.items():
        found = re.search(pattern, text)
        if found:
            raise PartitaError(f"{path}: {what.format(found.group(0))}")
    raise PartitaError(f"{path}: not a recognised launch config (no pretrain_gpt.py / --tensor-model-parallel-size "
                       "/ `megatron sft` for Megatron, no zero_optimization / train_batch_size for DeepSpeed, no "
                       "--parallelism.* / --training.* for torchtitan); name it with --from")


#: What a file must contain to be read as each framework's (else the importer would return defaults).
_MARKERS = {"megatron": (r"--(tensor|pipeline)-model-parallel-size|--micro-batch-size|--global-batch-size",
                         "no --tensor-model-parallel-size, --pipeline-model-parallel-size or batch flag"),
            "torchtitan": (_TITAN, "no --parallelism.* or --training.* setting, torchtitan.train or --job.config_file"),
            "deepspeed": (r"\"(zero_optimization|train_batch_size|train_micro_batch_size_per_gpu)\"",
                          "no zero_optimization or batch key")}


def check_kind(target: str, path: str, text: str) -> None:
    """A one-line error when ``text`` has none of ``target``'s markers (--from naming the wrong framework)."""
    pattern, missing = _MARKERS["megatron" if target == "mindspeed" else target]
    if not re.search(pattern, text):
        raise PartitaError(f"{path} does not look like a {target} launch config ({missing}); check the file or --from")
