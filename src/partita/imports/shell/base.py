"""What every part of the launch-script reader shares: the result (:class:`ShellRun`), its
error, the launcher flags and the limits that stop a script that never ends."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

#: torchrun / torch.distributed.run / deepspeed launcher flags giving ranks per node and nodes.
_PER_NODE = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
_NODES = ("--nnodes", "--num_nodes", "--num-nodes")
LAUNCHER_FLAGS = _PER_NODE + _NODES + ("--ntasks-per-node", "--nodes", "--ntasks", "-np", "--worker_num")
#: A training entry point of Megatron-LM / MindSpeed-LLM (pretrain_gpt.py, pretrain_mamba.py, posttrain_gpt.py)
#: and of Megatron forks (Pai-Megatron-Patch's pretrain_qwen.py, finetune_mcore_llama_withGA.py).
ENTRY = re.compile(r"(^|/)((pre|post)train|finetune)_\w*\.py$")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_ASSIGN_HEAD = re.compile(rf"^({_NAME})(\[[^\]]*\])?(\+?)=")
_MAX_STEPS = 100_000  # statements evaluated before giving up (a loop that never ends)
_MAX_SOURCE_DEPTH = 8
_MAX_LOOP = 100  # rounds of a while/until loop whose condition never changes here


@dataclass
class ShellRun:
    """What reading a script found: the commands it runs (expanded argv, in order), and what
    could not be known, as ``{what: the flag that supplies it}``."""

    commands: list[list[str]] = field(default_factory=list)
    #: what the reader could not know, as the text it left in the argv (``${NAME}``, ``$1``, ``$(cmd)``)
    unknown: dict[str, str] = field(default_factory=dict)
    #: variables a condition read while unset (bash took them as empty): {"$NAME": "--env NAME=..."}
    assumed: dict[str, str] = field(default_factory=dict)
    #: files the script writes itself, as bash would leave them: ``cat <<EOT > FILE`` (the here-document,
    #: expanded unless its delimiter is quoted) and ``sed "s/A/B/g" TEMPLATE [| sed ...] > FILE`` over a
    #: template that exists here; {the path as the script names it, expanded: its content}
    files: dict[str, str] = field(default_factory=dict)


class ShellError(ValueError):
    """A script this reader cannot follow (unbalanced quotes, a loop that does not end)."""
