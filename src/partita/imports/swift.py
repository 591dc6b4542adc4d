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
from typing import Any

from ..errors import PartitaError

#: ``megatron sft`` (pt, rlhf): the launcher's command and sub-command in a script.
SWIFT_COMMAND = re.compile(r"(?:^|[\s;|&])megatron\s+(sft|pt|rlhf)\b")
#: ms-swift's defaults that differ from Megatron-LM's (flag in Megatron's spelling, ms-swift's value).
_SWIFT_DEFAULTS = (("--use-distributed-optimizer", True), ("--recompute-granularity", "selective"),
                   ("--expert-tensor-parallel-size", "1"), ("--micro-batch-size", "1"),
                   ("--global-batch-size", "16"))
#: ms-swift flags that change memory or time that Partita does not model (name: what it changes).
_NOT_MODELLED = {"--tuner_type": "adapters (LoRA) train a few weights: the frozen base holds no gradients or "
                                 "optimizer states", "--train_type": "the old name of --tuner_type",
                 "--use_precision_aware_optimizer": "optimizer states in --exp_avg_dtype / --exp_avg_sq_dtype",
                 "--optimizer_cpu_offload": "optimizer states and step on the host"}
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


def swift_command(raw: str, expanded: str, env: dict[str, str], path: str) -> tuple[list[str], dict[str, str]]:
    """(the arguments after ``megatron sft``, the environment it runs with): the script's
    ``NAME=value`` prefix words and earlier assignments (``raw``, ``$NAME`` taken from ``env`` and
    earlier assignments), the arguments from ``expanded`` (the script with its variables substituted)."""
    values = dict(env)
    for word in _tokens(raw, path):
        name, eq, value = word.removeprefix("export ").partition("=")
        if eq and _ENV_NAME.match(name):
            values[name] = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: values.get(m.group(1), m.group(0)),
                                  value)
        elif word == "megatron":
            break
    words = _tokens(expanded, path)
    for i, word in enumerate(words[:-1]):
        if word == "megatron" and words[i + 1] in ("sft", "pt", "rlhf"):
            return words[i + 2:], values
    raise PartitaError(f"{path}: no `megatron sft|pt|rlhf` command found")


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


def swift_not_modelled(argv: list[str]) -> tuple[str, ...]:
    """``"--flag value: what it changes"`` for the ms-swift flags in ``argv`` that Partita does not model
    (a LoRA run, precision-aware optimizer states, host offload); ``false`` / ``full`` values are not features."""
    notes = []
    for i, word in enumerate(argv):
        name, eq, inline = word.partition("=")
        if name in _NOT_MODELLED:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            if value.lower() not in ("false", "full"):
                notes.append(f"{name} {value}: {_NOT_MODELLED[name]}")
    return tuple(notes)


def swift_framework(env: dict[str, str]) -> str:
    """``mindspeed`` for a script that runs on Ascend NPUs (ms-swift then runs MindSpeed), else ``megatron``."""
    return "mindspeed" if {"ASCEND_RT_VISIBLE_DEVICES", "PYTORCH_NPU_ALLOC_CONF"} & set(env) else "megatron"


def swift_spelling(notes: tuple[str, ...]) -> tuple[str, ...]:
    """Megatron-LM's not-modelled notes (``--fp8-param-gather: ...``) with the flag as the script spells
    it for ms-swift (``--fp8_param_gather``), so that the user finds it in the file."""
    return tuple(re.sub(r"^--[\w-]+", lambda m: m.group(0)[:2] + m.group(0)[2:].replace("-", "_"), note)
                 for note in notes)
