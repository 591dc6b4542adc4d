"""A Megatron-LM / MindSpeed-LLM launch script read the way bash runs it (issue 32 item 1): the
training command line it launches and the world size its launcher asks for, with the user's
positional arguments (``--args``) and environment (``--env``).

Two mechanisms, one result (:class:`~partita.imports.shell.ShellRun`): the static reader of
:mod:`partita.imports.shell` (the default: nothing is executed) and, only with the user's consent
(``--run-script``), the script run under bash with shims in place of the launchers
(:mod:`partita.imports.shell_run`). Why both: docs/export.md "How a script is read".
"""
from __future__ import annotations

import shlex

from ..errors import PartitaError
from .shell import LAUNCHER_FLAGS, ShellError, ShellRun, bare_arguments, find_launch, launcher_world_size, read_script


def script_command(path: str, raw: str, args: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None,
                   run_script: bool = False, devices: int | None = None) -> tuple[str, int | None, str] | None:
    """(``pretrain_gpt.py ARGS`` as one plain command line, the world size, a note of what the reading
    assumed or "") of the script at ``path``; None when no command of the script launches a training
    entry point or passes flags. A value that the importer reads but the script leaves unknown is one
    line naming what supplies it."""
    from .megatron import known_flags, switch_flags
    run = _run(path, raw, list(args), dict(env or {}), run_script)
    launch = find_launch(run)
    launcher, argv = launch if launch else ([], bare_arguments(run))
    if not argv:
        return None
    _check_known(path, argv, known_flags() - switch_flags(), run)
    if devices is None:
        _check_known(path, launcher, set(LAUNCHER_FLAGS), run, " (or --devices)")
    world = devices or launcher_world_size(launcher)
    argv = inline_ds_config(path, argv, run)
    return shlex.join(["pretrain_gpt.py", *argv]), world, assumed_line(run) or ""


#: Megatron-DeepSpeed's spellings of the DeepSpeed config path (megatron/arguments.py, deepspeed.add_config_arguments)
DS_CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed-config")


def inline_ds_config(path: str, argv: list[str], run: ShellRun) -> list[str]:
    """``argv`` with the value of ``--deepspeed_config FILE`` replaced by the file's content, base64
    (URL-safe) encoded, where the script writes FILE itself (:attr:`ShellRun.files`: a here-document or
    a ``sed`` over a template) or FILE is beside the script: DeepSpeed itself takes such a string as
    its config (deepspeed/runtime/config.py ``DeepSpeedConfig.__init__``: a path that does not exist is
    decoded with ``base64.urlsafe_b64decode``), so the command line stays one DeepSpeed accepts and
    :mod:`.megatron_deepspeed` reads the JSON the run would load. A file neither written nor here is
    left as the path (its ZeRO stage is then unknown, and said so)."""
    import base64
    from pathlib import Path
    out = list(argv)
    for i, tok in enumerate(out):
        name, eq, inline = tok.partition("=")
        if name not in DS_CONFIG_FLAGS or (not eq and i + 1 >= len(out)):
            continue
        value = inline if eq else out[i + 1]
        text = run.files.get(value)
        if text is None:
            here = next((p for p in (Path(path).parent / value, Path(value)) if value and p.is_file()), None)
            text = here.read_text(encoding="utf-8", errors="replace") if here else None
        if text is None:
            continue
        encoded = base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")
        if eq:
            out[i] = f"{name}={encoded}"
        else:
            out[i + 1] = encoded
    return out


def _run(path: str, raw: str, args: list[str], env: dict[str, str], run_script: bool) -> ShellRun:
    try:
        if run_script:
            from .shell_run import run_script as run_under_bash
            return run_under_bash(path, args, env)
        return read_script(raw, args, env, path)
    except ShellError as e:
        raise PartitaError(f"{path}: cannot follow the script: {e} (--run-script runs it under bash instead)"[:300]) \
            from None


def _check_known(path: str, argv: list[str], flags: set[str], run: ShellRun, also: str = "") -> None:
    """One line naming the value a read flag takes from something with no value, and what supplies it."""
    for i, tok in enumerate(argv):
        name, eq, inline = tok.partition("=")
        flag, value = (name, inline) if eq and name in flags else (argv[i - 1], tok) if i else ("", "")
        if flag not in flags:
            continue
        for unknown, supply in run.unknown.items():
            if unknown in value:
                raise PartitaError(f"{path}: {flag} is {value[:60]}, which has no value when the script is read: "
                                   f"pass {supply}{also}")


def assumed_line(run: ShellRun) -> str | None:
    """One line naming what the reading had to assume: variables a condition read unset (empty, as
    bash has them without ``--env``), tests of files not on this machine (true), sourced files not here."""
    missing = [k[len("source "):] for k in run.unknown if k.startswith("source ")]
    if not run.assumed and not missing:
        return None
    unset = [k for k in run.assumed if k.startswith("$")]
    files = [k for k in run.assumed if k.startswith("[")]
    loops = [f"{k} {run.assumed[k]}" for k in run.assumed if k.startswith("a ")]
    supply = ", ".join(run.assumed[k] for k in unset)
    parts = ([f"read with {', '.join(unset)} unset, so empty as bash has it ({supply} sets it)"] if unset else []) \
        + ([f"{', '.join(files)} taken as true (files of your cluster's; --run-script tests them here)"]
           if files else [])
    parts += loops
    parts += [f"read without {', '.join(missing)} (sourced, not on this machine; --env sets what it would)"] \
        if missing else []
    return "; ".join(parts)[:400]


def world_hint(error: PartitaError, devices: int | None, script_world: int | None) -> PartitaError:
    """``error`` with where its device count came from, when the script's launcher gave it (a file
    shipped with one node's defaults whose layout needs more: ``--devices`` or ``--env`` fixes it)."""
    text = str(error)
    if devices is not None or script_world is None or not any(k in text for k in ("world size", "dp", "devices")):
        return error
    return PartitaError(f"{text} (read with the {script_world} devices the script's launcher asks for: pass --devices, "
                        "or --env for the variable its node count comes from)")
