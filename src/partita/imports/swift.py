"""The Megatron-SWIFT launcher (ms-swift's ``megatron sft|pt|rlhf`` command) read as the
Megatron-LM command line it runs (issue 32, "what went wrong" item 6).

``megatron sft ...`` is ms-swift's CLI: it parses its own dataclass arguments (underscore
flags, booleans written ``--flag true``), fills Megatron's arguments from them with defaults of
its own, and starts ``torch.distributed.run`` when ``NPROC_PER_NODE`` or ``NNODES`` is in the
environment. This module turns that into the Megatron-LM argv :mod:`.megatron` reads, adding
the defaults where ms-swift's differ from Megatron-LM's.

Facts from ms-swift (modelscope/ms-swift@3602360, v4.5):

- launch (``swift/cli/main.py`` ``get_torchrun_args``): ``NPROC_PER_NODE``, ``NNODES``,
  ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` become torchrun's ``--nproc_per_node`` ...;
  neither of the first two set: one process, no torchrun. torchrun's ``--nproc_per_node``
  defaults to 1.
- defaults (``swift/megatron/arguments/megatron_args.py`` ``MegatronArguments``):
  ``use_distributed_optimizer = True`` (Megatron-LM: off), ``recompute_granularity =
  'selective'`` ('none' means none), ``expert_tensor_parallel_size = 1`` (Megatron-LM: the tp
  size), ``micro_batch_size = 1``, ``global_batch_size = 16``; ``sequence_parallel`` is switched
  off when tp is 1.
- sequence length (``megatron_base_args.py`` ``__post_init__``): ``seq_length = packing_length or
  max_length``.
- precision (``_map_dtype`` and ``ModelArguments._init_mixed_precision``): ``--fp16`` / ``--bf16``,
  else ``--torch_dtype``, else the model's ``config.json`` dtype; Partita cannot read the latter
  and takes bf16 (every model the ms-swift Megatron examples train ships in bf16) unless
  ``--dtype`` says otherwise.
- on Ascend (``swift/megatron/__init__.py``): ``import mindspeed.megatron_adaptor`` - the run is
  MindSpeed's (Partita's ``mindspeed`` framework); a script for NPUs is known by
  ``ASCEND_RT_VISIBLE_DEVICES`` / ``PYTORCH_NPU_ALLOC_CONF``.
"""
from __future__ import annotations

import re
import shlex
from typing import Any, Iterator

from ..errors import PartitaError

#: ``megatron sft`` (pt, rlhf): the launcher's command and sub-command in a script.
SWIFT_COMMAND = re.compile(r"(?:^|[\s;|&])megatron\s+(sft|pt|rlhf)\b")
#: ms-swift's defaults that differ from Megatron-LM's (flag in Megatron's spelling, ms-swift's value).
_SWIFT_DEFAULTS = (("--use-distributed-optimizer", True), ("--recompute-granularity", "selective"),
                   ("--expert-tensor-parallel-size", "1"), ("--micro-batch-size", "1"),
                   ("--global-batch-size", "16"))
#: ms-swift flags that change memory or time that Partita does not model (name: what it changes).
_NOT_MODELLED = {  # `megatron rlhf` / `swift rlhf` (ms-swift's RLHFArguments: rlhf_type dpo by default)
                 "--rlhf_type": "a preference or RL stage (DPO/KTO: a frozen reference model and chosen + rejected "
                                "sequences; GRPO: rollouts by an inference engine beside the policy; GKD: a "
                                "teacher model), estimated as supervised training of the policy alone"}
#: ``--optimizer_cpu_offload`` is Megatron's ``--optimizer-cpu-offload`` (the plan's ``optimizer_offload``; its
#: untimed host step is named by the Megatron reader), ``--use_precision_aware_optimizer`` with
#: ``--exp_avg_dtype`` / ``--exp_avg_sq_dtype`` Megatron's (the plan's ``moment_dtype``). Padding-free
#: batches (ms-swift's ``padding_free``: "flattens the data within a batch to avoid padding",
#: swift/arguments/base_args/template_args.py; True by default under ``megatron sft|pt|rlhf``,
#: swift/megatron/arguments/megatron_args.py, False for ``swift sft``): a micro-batch is its samples' own
#: lengths, not micro_batch_size x max_length; with ``--packing true`` the sequence is filled to the packing
#: length, which is what the estimate counts.
PADDING_FREE_NOTE = ("--padding_free true: a micro-batch is its samples flattened at their own lengths, not "
                     "micro_batch_size x max_length (less activation memory and time than estimated; the "
                     "estimate is the bound where every sample is max_length long)")
#: what ``megatron rlhf`` / ``swift rlhf`` run without ``--rlhf_type`` (swift/arguments/rlhf_args.py)
RLHF_DEFAULT = "dpo"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")


def is_swift(text: str) -> bool:
    """Whether ``text`` launches Megatron-SWIFT (``megatron sft``, ``megatron pt``, ``megatron rlhf``)."""
    return bool(SWIFT_COMMAND.search(text))


#: A comment as bash sees one: ``#`` at the start of a word (``--dataset 'a#100'`` and ``a#100`` keep theirs).
_COMMENT = re.compile(r"""(?:^|(?<=\s))#[^'"]*$""")


def _tokens(text: str, path: str) -> list[str]:
    """The words of ``text`` as bash splits them: line continuations joined, comments dropped (only
    ``#`` that starts a word: shlex's own comment handling also cuts ``dataset#1000``)."""
    lines = [_COMMENT.sub("", line) for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\s*\Z", "", "\n".join(lines).replace("\\\n", " "))  # a last line ending in "\"
    try:
        return shlex.split(joined)
    except ValueError as e:
        raise PartitaError(f"{path}: cannot split the megatron command into words: {e}") from None


def swift_command(raw: str, expanded: str, env: dict[str, str], path: str,
                  program: str = "megatron") -> tuple[list[str], dict[str, str]]:
    """(the arguments after ``megatron sft`` - or ``swift sft`` -, the environment it runs with): the
    script's ``NAME=value`` prefix words and earlier assignments (``raw``, ``$NAME`` taken from ``env``
    and earlier assignments), the arguments from ``expanded`` (the script with its variables substituted)."""
    values = dict(env)
    try:
        prefix = _tokens(raw, path)
    except PartitaError:  # quotes this splitter cannot follow: the plain assignments at line starts
        prefix = re.findall(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*=\S*)", raw, re.MULTILINE)
    for word in prefix:
        name, eq, value = word.removeprefix("export ").partition("=")
        if eq and _ENV_NAME.match(name):
            values[name] = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: values.get(m.group(1), m.group(0)),
                                  value)
        elif word == program:
            break
    for words in _commands(raw, expanded, env, path):
        for i, word in enumerate(words[:-1]):
            if word == program and words[i + 1] in ("sft", "pt", "rlhf"):
                return words[i + 2:], values
    raise PartitaError(f"{path}: no `{program} sft|pt|rlhf` command found")


def _commands(raw: str, expanded: str, env: dict[str, str], path: str) -> Iterator[list[str]]:
    """The script's commands as bash runs them (:mod:`.shell`: ``$(expr 16 / $n)``, arrays,
    conditionals), last first; then its words as written (a script that ``exit``s before the
    launch here, e.g. after a ``source`` of a file only the cluster has)."""
    from .shell import ShellError, read_script
    try:
        yield from reversed(read_script(raw, (), env, path).commands)
    except ShellError:
        pass
    yield _tokens(expanded, path)


def swift_world_size(env: dict[str, str], path: str) -> int | None:
    """Ranks the launcher starts: ``NPROC_PER_NODE`` (torchrun's default 1) x ``NNODES``; one
    process when neither is set; None when one is not a number (``--env`` or ``--devices`` gives it)."""
    if "NPROC_PER_NODE" not in env and "NNODES" not in env:
        return 1
    per_node, nodes = env.get("NPROC_PER_NODE", "1"), env.get("NNODES", "1")
    if not (per_node.isdigit() and nodes.isdigit()):
        return None
    return int(per_node) * int(nodes)


def _dash(flag: str) -> str:
    return "--" + flag[2:].replace("_", "-")


def megatron_argv(argv: list[str], seq_len: int | None, dtype: str | None, path: str) -> list[str]:
    """The Megatron-LM argv ``megatron sft`` runs: flags in Megatron's spelling, ``--flag true``
    as ``--flag`` (``false`` dropped), ms-swift's own defaults added where the script leaves them,
    ``--seq-length`` from ``--packing_length`` / ``--max_length`` (or ``seq_len``), and a precision flag."""
    out: list[str] = []
    given: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("--"):
            i += 1
            continue
        name, eq, inline = word.partition("=")
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None)
        i += 1 if eq or value is None else 2
        flag = _dash(name)
        if value is not None and value.lower() in ("true", "false"):
            given[flag] = value.lower() == "true"
            out += [flag] if given[flag] else []
        else:
            given[flag] = value
            out += [flag] + ([value] if value is not None else [])
    for flag, default in _SWIFT_DEFAULTS:
        if flag not in given:
            out += [flag] if default is True else [flag, default]
    length = given.get("--packing-length") or given.get("--max-length") or seq_len
    if not length:
        raise PartitaError(f"{path}: the sequence length is the model's (no --max_length or --packing_length in the "
                           "script): pass --seq-len")
    out += ["--seq-length", str(length)]
    if not any(given.get(f) is True for f in ("--bf16", "--fp16")):
        torch_dtype = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(str(given.get("--torch-dtype")))
        precision = dtype or torch_dtype or "bf16"
        out += {"bf16": ["--bf16"], "fp16": ["--fp16"], "fp8": ["--bf16", "--fp8-format", "e4m3"]}.get(precision, [])
    return out


def swift_not_modelled(argv: list[str], megatron: bool = False) -> tuple[str, ...]:
    """``"--flag value: what it changes"`` for the ms-swift flags in ``argv`` that Partita does not model
    (an RLHF stage, padding-free batches - on by default under
    ``megatron``, :data:`PADDING_FREE_NOTE`); ``false`` / ``full`` values are not features."""
    notes = [PADDING_FREE_NOTE] if padding_free(argv, megatron) else []
    for i, word in enumerate(argv):
        name, eq, inline = word.partition("=")
        if name in _NOT_MODELLED:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.lower() not in ("false", "full"):
                notes.append(f"{name} {value}: {_NOT_MODELLED[name]}")
    return tuple(notes)


def padding_free(argv: list[str], megatron: bool) -> bool:
    """Whether the run flattens each micro-batch's samples at their own lengths: ``--padding_free``
    as given, else ms-swift's default (True under ``megatron``, False for ``swift sft``), never with
    ``--packing true`` (the packed sequence is filled to its length)."""
    given = {f: (v or ["true"])[-1].lower() == "true" for f in ("--padding_free", "--packing")
             if (v := _values(argv, f)) is not None}
    return not given.get("--packing", False) and given.get("--padding_free", megatron)


def _values(argv: list[str], flag: str) -> list[str] | None:
    """Every word after ``flag`` up to the next flag (``--target_modules q_proj v_proj``), None when absent."""
    for i, word in enumerate(argv):
        name, eq, inline = word.partition("=")
        if name == flag:
            if eq:
                return [inline]
            rest = argv[i + 1:]
            return rest[:next((j for j, w in enumerate(rest) if w.startswith("--")), len(rest))]
    return None


def swift_finetune(argv: list[str], command: str, megatron: bool, path: str) -> tuple[dict, str]:
    """(the plan's fine-tuning fields, a note or "") of an ms-swift command line (issue 36 item 4).

    ``--tuner_type`` (``--train_type`` before ms-swift 4) defaults to ``lora`` for ``swift sft|pt|rlhf``
    (swift/arguments/base_args/base_args.py) and to ``full`` for Megatron-SWIFT
    (swift/megatron/arguments/megatron_args.py); ``--lora_rank`` 8, ``--lora_alpha`` 32,
    ``--target_modules all-linear``, ``--lora_dropout`` 0.05 in both (swift/arguments/tuner_args.py l.135,
    swift/megatron/arguments/megatron_args.py l.467 at ms-swift@3602360a). ``full`` under ``sft`` /
    ``rlhf`` is a fine-tune of every weight, under ``pt`` a pre-training run; a tuner other than LoRA is
    named, the plan then estimating every weight trained."""
    args = _flag_values(argv)
    tuner = (args.get("--tuner_type") or args.get("--train_type") or ("full" if megatron else "lora")).lower()
    if tuner == "full":
        return ({"finetune": "full"} if command != "pt" else {}), ""
    if tuner not in ("lora", "lora_llm"):
        return {}, f"--tuner_type {tuner}: a tuner Partita does not model (estimated with every weight trained)"
    from .finetune import lora_targets
    targets, note = lora_targets(_values(argv, "--target_modules") or ["all-linear"], "--target_modules")
    try:
        alpha = float(args.get("--lora_alpha", "32"))
    except ValueError:
        raise PartitaError(f"{path}: --lora_alpha {args['--lora_alpha'][:30]} must be a number") from None
    dropout = _probability(args, "--lora_dropout", "0.05", path)
    return {"finetune": "lora", "lora_rank": _whole(args, "--lora_rank", 8, path), "lora_alpha": alpha,
            "lora_targets": targets, "lora_dropout": dropout}, note


def _probability(args: dict, flag: str, default: str, path: str) -> float:
    """``flag``'s value as a dropout probability in [0, 1) (one line naming it otherwise)."""
    try:
        value = float(args.get(flag, default))
    except ValueError:
        raise PartitaError(f"{path}: {flag} {args[flag][:30]} must be a number") from None
    if not 0 <= value < 1:
        raise PartitaError(f"{path}: {flag} {value:g} must be a dropout probability, from 0 to below 1")
    return value


def swift_subcommand(raw: str) -> str:
    """``sft``, ``pt`` or ``rlhf``: the ms-swift sub-command a script runs (``megatron X`` or ``swift X``)."""
    match = SWIFT_COMMAND.search(raw) or SWIFT_TRAINER.search(raw)
    return match.group(1) if match else "sft"


def swift_framework(env: dict[str, str]) -> str:
    """``mindspeed`` for a script that runs on Ascend NPUs (ms-swift then runs MindSpeed), else ``megatron``."""
    return "mindspeed" if {"ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF"} & set(env) else "megatron"


def swift_spelling(notes: tuple[str, ...]) -> tuple[str, ...]:
    """Megatron-LM's not-modelled notes (``--fp8-param-gather: ...``) with the flag as the script spells
    it for ms-swift (``--fp8_param_gather``), so that the user finds it in the file."""
    return tuple(re.sub(r"^--[\w-]+", lambda m: m.group(0)[:2] + m.group(0)[2:].replace("-", "_"), note)
                 for note in notes)


# ------------------------------------------------------------------ ``swift sft``: the Trainer with DeepSpeed
#: ``swift sft|pt|rlhf``: ms-swift's Hugging Face Trainer path (read when it runs DeepSpeed).
SWIFT_TRAINER = re.compile(r"(?:^|[\s;|&])swift\s+(sft|pt|rlhf)\b")
#: ms-swift's ``--deepspeed`` presets (``swift/config/<name>.json``): ZeRO stage, optimizer and
#: parameter offload device; every batch and dtype value in them is "auto".
_DS_PRESETS = {"zero0": (0, None, None), "zero1": (1, None, None), "zero2": (2, None, None),
               "zero2_offload": (2, "cpu", None), "zero3": (3, None, None), "zero3_offload": (3, "cpu", "cpu")}


def is_swift_trainer(text: str) -> bool:
    """Whether ``text`` runs ``swift sft|pt|rlhf`` (ms-swift's Trainer path: DeepSpeed with
    ``--deepspeed``, else torch DDP)."""
    return bool(SWIFT_TRAINER.search(text))


#: ``swift sft`` without ``--deepspeed``: what the estimate (DeepSpeed ZeRO-0) leaves out.
DDP_NOTE = ("--deepspeed not given: the Hugging Face Trainer's torch DDP; full fine-tuning keeps weights, gradients and "
            "AdamW states in the model's dtype (bf16: 8 bytes per trained parameter), estimated as DeepSpeed "
            "ZeRO-0 mixed precision (18)")


def _flag_values(argv: list[str]) -> dict[str, str]:
    """``{--flag: value}`` of an ms-swift command line (the last one wins, as its parser does)."""
    values: dict[str, str] = {}
    for i, word in enumerate(argv):
        name, eq, inline = word.partition("=")
        if name.startswith("--"):
            values[name] = inline if eq else argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") \
                else "true"
    return values


def _ds_base(value: str | None, base_dir: str, path: str) -> dict:
    """The ds_config ``--deepspeed`` names: a preset of ms-swift's or a JSON file (next to the script)."""
    import os
    if value in _DS_PRESETS:
        stage, optimizer, params = _DS_PRESETS[value]
        zero: dict = {"stage": stage}
        zero.update({"offload_optimizer": {"device": optimizer}} if optimizer else {})
        zero.update({"offload_param": {"device": params}} if params else {})
        return {"zero_optimization": zero, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    from ..inputs import read_json
    file = value if value is None or os.path.isabs(value) else os.path.join(base_dir, value)
    if not value or not os.path.isfile(file):
        raise PartitaError(f"{path}: --deepspeed {value} is neither one of ms-swift's presets "
                           f"({', '.join(_DS_PRESETS)}) nor a file found next to the script")
    cfg = read_json(file, "DeepSpeed config")
    if not isinstance(cfg, dict):
        raise PartitaError(f"{file} must hold a JSON object (a DeepSpeed config)")
    return cfg


def _whole(args: dict[str, str], flag: str, default: int, path: str) -> int:
    """``args[flag]`` as a whole number from 1 (``default`` when absent), else one line naming the flag."""
    text = args.get(flag)
    if text is None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise PartitaError(f"{path}: {flag} {text[:30]} must be a whole number from 1")
    return int(text)


def trainer_ds_config(argv: list[str], world: int, base_dir: str, path: str) -> tuple[dict, int | None]:
    """(the ds_config ``swift sft --deepspeed X`` runs on ``world`` ranks, its sequence length or None):
    the preset or file with the "auto" values the Trainer fills from ms-swift's arguments
    (``swift/trainers/arguments.py``: ``per_device_train_batch_size`` 1; ``gradient_accumulation_steps``
    unset is ``max(1, ceil(16 / per_device / world))``), ``--torch_dtype`` / ``--bf16`` / ``--fp16``
    for the dtype (unset: the model's, left "auto" for ``--dtype``), ``--deepspeed_autotp_size`` and
    ``--zero_hpz_partition_size`` (``swift/arguments/sft_args.py`` ``_init_deepspeed``)."""
    import math
    args = _flag_values(argv)
    cfg = dict(_ds_base(args.get("--deepspeed", "zero0"), base_dir, path))  # none: DDP (DDP_NOTE)
    mbs = _whole(args, "--per_device_train_batch_size", 1, path)
    gas = _whole(args, "--gradient_accumulation_steps", 0, path) or max(1, math.ceil(16 / mbs / world))
    filled = {"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": gas,
              "train_batch_size": mbs * gas * world}
    cfg.update({key: value for key, value in filled.items() if cfg.get(key, "auto") == "auto"})
    dtype = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(args.get("--torch_dtype", ""))
    dtype = "bf16" if args.get("--bf16", "").lower() == "true" else "fp16" if \
        args.get("--fp16", "").lower() == "true" else dtype
    for key in ("bf16", "fp16"):
        if dtype and (cfg.get(key) or {}).get("enabled") == "auto":
            cfg[key] = dict(cfg[key], enabled=dtype == key)
    if args.get("--deepspeed_autotp_size"):
        cfg["tensor_parallel"] = {"autotp_size": int(args["--deepspeed_autotp_size"])}
    if args.get("--zero_hpz_partition_size"):
        cfg["zero_optimization"] = dict(cfg.get("zero_optimization") or {},
                                        zero_hpz_partition_size=int(args["--zero_hpz_partition_size"]))
    length = args.get("--max_length")
    return cfg, int(length) if length and length.isdigit() else None
