"""Launch scripts as text: the command line after the training entry point, the variables it is
built from, and the world size its launcher asks for."""
from __future__ import annotations

import re
import shlex

#: torchrun / torch.distributed.run / deepspeed launcher flags giving ranks per node and nodes.
_PER_NODE = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
_NODES = ("--nnodes", "--num_nodes", "--num-nodes")


def argv_from_script(text: str, entry: str = "pretrain_gpt.py") -> list[str]:
    """The arguments after ``entry`` in a shell script or command line (``\\`` continuations and
    ``#`` comments handled; a text without ``entry`` is taken as bare arguments)."""
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    tokens = shlex.split("\n".join(lines).replace("\\\n", " "), comments=True)
    for i, tok in enumerate(tokens):
        if tok.endswith(entry):
            return tokens[i + 1:]
    return tokens


_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\((?:[^()]*)\)|\"[^\"]*\"|'[^']*'|\S*)",
                     re.MULTILINE)


def expand_variables(text: str) -> str:
    """The script with its plain ``NAME=value`` / ``NAME=( ... )`` assignments substituted into
    ``$NAME``, ``${NAME}`` and ``${NAME[@]}`` (how Megatron's example scripts pass their flags).
    Nothing is executed: command substitutions and arithmetic stay as written."""
    values: dict[str, str] = {}
    for name, raw in _ASSIGN.findall(text):
        value = raw[1:-1] if raw[:1] in "(\"'" else raw
        values[name] = re.sub(r"\\\n|\n|#[^\n]*", " ", value) if raw[:1] == "(" else value
    def sub(m: re.Match) -> str:
        return values.get(m.group(1) or m.group(2), m.group(0))
    body = _ASSIGN.sub("", text)
    for _ in range(3):  # values that name other variables (DISTRIBUTED_ARGS uses $GPUS_PER_NODE)
        body = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\[@\])?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, body)
    return body


def script_world_size(text: str) -> int | None:
    """Ranks per node x nodes of the script's torchrun / deepspeed launcher, when both are numbers."""
    try:
        tokens = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError:
        return None
    found: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        name, _, inline = tok.partition("=")
        value = inline or (tokens[i + 1] if i + 1 < len(tokens) else "")
        kind = "per_node" if name in _PER_NODE else "nodes" if name in _NODES else None
        if kind and value.split(":")[-1].isdigit():
            found.setdefault(kind, int(value.split(":")[-1]))  # an elastic range "1:4": its maximum
    if "per_node" not in found:
        return None
    return found["per_node"] * found.get("nodes", 1)
