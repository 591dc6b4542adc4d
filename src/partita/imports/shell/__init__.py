"""Launch scripts read the way bash runs them (issue 32 item 1), without running them.

:func:`read_script` evaluates the part of bash that launch scripts use to build a command line
(survey in docs/export.md "Import"): assignments and ``export``, arrays with ``+=`` and re-declared
with their own contents, ``${VAR:-x}`` / ``${VAR:=x}`` / ``${VAR:+x}`` / ``${#VAR}`` / ``%`` ``#``
trims, ``$((...))``, ``\\`` continuations, ``if``/``elif``/``else``, ``case``, ``for``, ``[ ]`` and
``[[ ]]`` tests, ``&&`` / ``||`` / ``!``, ``while`` / ``break``, shell functions, positional arguments
and ``shift`` / ``set --``, ``source`` of files that exist, ``$(...)`` that only prints, and the job
scripts of ``sbatch <<EOF`` / ``bash -c`` / ``srun ... bash -c`` (``#SBATCH`` flags given to ``srun``), and
the files a script writes itself (``cat <<EOT > FILE``, ``sed "s/A/B/g" TEMPLATE | sed ... > FILE``:
:attr:`ShellRun.files`, e.g. the ds_config a Megatron-DeepSpeed script passes as ``--deepspeed_config``).
Commands are never executed: every command the script would run is recorded with its expanded argv
(:attr:`ShellRun.commands`), so the launcher and the training entry point are found as bash would
call them. What cannot be known without running the script (a variable with no value, another
command's output) is recorded in :attr:`ShellRun.unknown` with the flag of ours that supplies it;
what a condition had to assume (an unset variable read as empty, a file of the cluster's taken as
present, a loop stopped) in :attr:`ShellRun.assumed`. :func:`partita.imports.shell_run.run_script` is the other
mechanism (the script run under bash with shims), only with the user's consent.

Bash's own semantics are the reference (bash(1), "EXPANSION" and "Arrays"); the reader is ours.
Its parts, in the order a script goes through them: :mod:`.tokens` (words and operators),
:mod:`.parse` (the grammar), :mod:`.expand` (parameter, arithmetic and command expansion),
:mod:`.evaluate` (the script evaluated, commands recorded); :mod:`.base` holds what they share.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

from .base import _NODES, _PER_NODE, ENTRY, LAUNCHER_FLAGS, ShellError, ShellRun
from .evaluate import _Evaluator
from .expand import _Done
from .parse import _Parser
from .tokens import tokenize

__all__ = ["ENTRY", "LAUNCHER_FLAGS", "ShellError", "ShellRun", "argv_from_script", "bare_arguments",
           "expand_variables", "find_launch", "launcher_world_size", "read_script", "script_world_size"]


def read_script(text: str, args: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None,
                path: str | Path | None = None) -> ShellRun:
    """Every command ``text`` would run under bash with positional ``args`` and environment ``env``,
    expanded; nothing is executed. Raises :class:`ShellError` on a script it cannot follow."""
    run = ShellRun()
    shell = _Evaluator(list(args), dict(env or {}), Path(path) if path else None, run)
    try:
        parser = _Parser(tokenize(text))
        nodes = parser.parse_list()
        if parser.peek() is not None:
            raise ShellError(f"unexpected {parser.peek()[1]!r} at line {parser.peek()[2]}")
        shell.execute(nodes)
    except _Done:
        pass
    except RecursionError:
        raise ShellError("nested too deeply") from None
    return run


def find_launch(run: ShellRun, entry: re.Pattern = ENTRY) -> tuple[list[str], list[str]] | None:
    """(the launcher's argv before the entry point, the arguments after it) of the last command that
    calls ``entry``; None when no command does."""
    for argv in reversed(run.commands):
        for k, tok in enumerate(argv):
            if entry.search(tok):
                return argv[:k], argv[k + 1:]
    return None


def bare_arguments(run: ShellRun) -> list[str]:
    """The words of commands that start with a flag: a file holding only the training arguments."""
    return [tok for argv in run.commands if argv[0].startswith("-") for tok in argv]


def launcher_world_size(tokens: list[str]) -> int | None:
    """Ranks per node x nodes of a torchrun / deepspeed launcher's arguments, when both are numbers
    (MindSpore's ``msrun --worker_num``: all ranks)."""
    found: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        name, _, inline = tok.partition("=")
        value = inline or (tokens[i + 1] if i + 1 < len(tokens) else "")
        if name == "--worker_num" and value.isdigit():
            return int(value)
        kind = "per_node" if name in _PER_NODE else "nodes" if name in _NODES else None
        if kind and value.split(":")[-1].isdigit():
            found.setdefault(kind, int(value.split(":")[-1]))  # an elastic range "1:4": its maximum
    if "per_node" not in found:
        return _task_launcher_world_size(tokens)
    return found["per_node"] * found.get("nodes", 1)


#: srun / mpirun flags: one task is one rank (``--ntasks-per-node`` x ``--nodes``, or ``--ntasks`` / ``-np``).
_TASKS_PER_NODE, _TASK_NODES, _TASKS = ("--ntasks-per-node",), ("--nodes", "-N"), ("--ntasks", "-n", "-np")


def _task_launcher_world_size(tokens: list[str]) -> int | None:
    """Ranks of an ``srun`` / ``mpirun`` launch (only where one of them is the launcher)."""
    if not any(tok.rsplit("/", 1)[-1] in ("srun", "mpirun", "mpiexec") for tok in tokens):
        return None
    found: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        name, eq, inline = tok.partition("=")
        value = inline if eq else (tokens[i + 1] if i + 1 < len(tokens) else "")
        kind = "per_node" if name in _TASKS_PER_NODE else "nodes" if name in _TASK_NODES else \
            "total" if name in _TASKS else None
        if kind and value.isdigit():
            found.setdefault(kind, int(value))
    if "total" in found:
        return found["total"]
    return found["per_node"] * found.get("nodes", 1) if "per_node" in found else None


def argv_from_script(text: str, entry: str = "pretrain_gpt.py") -> list[str]:
    """The arguments after ``entry`` in a plain command line (``\\`` continuations and ``#`` comments
    handled; a text without ``entry`` is taken as bare arguments). No variables: :func:`read_script`."""
    lines = [l for l in text.splitlines() if not l.lstrip().startswith("#")]
    tokens = shlex.split("\n".join(lines).replace("\\\n", " "), comments=True)
    for i, tok in enumerate(tokens):
        if tok.endswith(entry):
            return tokens[i + 1:]
    return tokens


def script_world_size(text: str) -> int | None:
    """Ranks per node x nodes of a plain command line's torchrun / deepspeed launcher."""
    try:
        return launcher_world_size(shlex.split(text.replace("\\\n", " "), comments=True))
    except ValueError:
        return None


_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\((?:[^()]*)\)|\"[^\"]*\"|'[^']*'|\S*)",
                     re.MULTILINE)


def expand_variables(text: str) -> str:
    """The text with plain ``NAME=value`` assignments substituted into ``$NAME`` (torchtitan override
    files; launch scripts go through :func:`read_script`, which follows bash)."""
    values: dict[str, str] = {}
    for name, raw in _ASSIGN.findall(text):
        value = raw[1:-1] if raw[:1] in "(\"'" else raw
        values[name] = re.sub(r"\\\n|\n|#[^\n]*", " ", value) if raw[:1] == "(" else value
    def sub(m: re.Match) -> str:
        return values.get(m.group(1) or m.group(2), m.group(0))
    body = _ASSIGN.sub("", text)
    for _ in range(3):
        body = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:\[@\])?\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, body)
    return body
