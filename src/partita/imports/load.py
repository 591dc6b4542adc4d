"""One launch file (Megatron/MindSpeed script, DeepSpeed ``ds_config``, torchtitan overrides or
TOML) read into a checked :class:`~partita.plan.Plan`: the one entry point ``partita import``,
``estimate --from-script`` and ``plan --from-script`` share, so the three read a file the same way."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import PartitaError
from ..plan import Plan
from .detect import check_kind, detect, read_text
from .script import world_hint
from .shell import argv_from_script, expand_variables, script_world_size


@dataclass(frozen=True)
class Imported:
    """What a launch file says: the plan (its ``framework`` the one the file runs under), the
    framework detected (the ``--from`` name), and ``"name value: what it changes"`` for each
    setting that changes cost but is not modelled. Unpacks as ``plan, framework``."""

    plan: Plan
    framework: str
    not_modelled: tuple[str, ...] = field(default=())
    #: the model to estimate with: ``--model``, else the one a Megatron/MindSpeed command line
    #: defines (None: neither; ``model_note`` says what the file lacks, e.g. its vocabulary)
    model: Any = None
    model_note: str = ""
    #: what reading a script assumed (unset variables its conditions read, files not here), or ""
    reading_note: str = ""

    def __iter__(self) -> Iterator[Any]:
        return iter((self.plan, self.framework))


def _parse(target: str, path: str, text: str, world: int | None, model: Any, seq_len: int | None,
           pp: int | None, fill: dict[str, Any], raw: str, env: dict[str, str],
           args: list[str] | tuple[str, ...] = ()) -> tuple[Plan, tuple[str, ...]]:
    """The importer of ``target`` on the file's text (world size checked by the caller): (plan, not
    modelled); a Megatron/MindSpeed command line's own model is :func:`_script_model`'s."""
    layers = model.layers if model else None
    from . import deepspeed, llamafactory, megatron, swift, torchtitan
    if target == "internevo":  # an InternEvo Python config: its assignments evaluated, nothing executed
        from .internevo import plan_from_internevo, read_assignments
        return plan_from_internevo(read_assignments(raw, path), path, world)
    if target == "nanotron":  # a nanotron YAML: the layout and the model are fields of its Config tree
        from .nanotron import plan_from_nanotron
        from .yaml_file import read_yaml_mapping
        return plan_from_nanotron(read_yaml_mapping(raw, path, "a nanotron config"), path, world)
    if target == "llamafactory":  # a LLaMA-Factory training YAML (its ds_config beside it, "auto" filled)
        return llamafactory.plan_from_llamafactory(path, raw, world or llamafactory.world_from_env(env), fill)
    if path.endswith(".toml") and target == "torchtitan":
        text = shlex.join(torchtitan.toml_argv(path, raw))  # the TOML as written (not as a shell script: enable=true)
    if target in ("megatron", "mindspeed") and swift.is_swift(raw):
        return _swift(path, raw, text, world, layers, seq_len, fill, env)
    if target == "deepspeed" and swift.is_swift_trainer(raw):
        return _swift_trainer(path, raw, world, seq_len, pp, fill, env)
    from . import dschat, openrlhf
    if target == "deepspeed" and openrlhf.is_openrlhf(raw):
        return _openrlhf(path, raw, world, fill, env, args)
    if target == "deepspeed" and dschat.is_dschat(raw):
        return _dschat(path, raw, world, fill, env, args)
    check_kind(target, path, text)
    if target == "deepspeed":
        from ..inputs import read_json
        cfg = read_json(path, "DeepSpeed config")  # size, UTF-8, depth, NaN/Infinity: one line each
        if not isinstance(cfg, dict):
            raise PartitaError(f"{path} must hold a JSON object (a DeepSpeed config)")
        deepspeed.check_ds_config(path, cfg)
        plan = deepspeed.plan_from_ds_config(cfg, _need_world(path, world), seq_len or 2048, pp, fill, path)
        return plan, deepspeed.ds_not_modelled(cfg)
    if target == "torchtitan":
        launch = None if path.endswith(".toml") else torchtitan.script_argv(raw, path, env, args)  # as bash runs it
        argv, world = (launch[0], world or launch[1]) if launch else (argv_from_script(text, "torchtitan.train"), world)
        argv = torchtitan.with_config_file(argv, path)  # --job.config_file's TOML, then the overrides
        check_sizes(path, argv, torchtitan.TITAN_SIZES, minus_one=torchtitan.TITAN_FILL)
        return torchtitan.titan_plan(argv, world, layers), torchtitan.titan_not_modelled(argv, layers)
    argv = argv_from_script(text)
    check_sizes(path, argv, megatron.MEGATRON_SIZES)
    read = megatron.read_megatron(argv, _need_world(path, world), model, target, path)
    from .megatron_deepspeed import is_megatron_deepspeed  # DeepSpeed's engine runs it (cost/frameworks.py)
    return read.plan.with_(framework="deepspeed" if is_megatron_deepspeed(argv) else target), read.not_modelled


def _swift(path: str, raw: str, text: str, world: int | None, layers: int | None, seq_len: int | None,
           fill: dict[str, Any], env: dict[str, str]) -> tuple[Plan, tuple[str, ...]]:
    """A Megatron-SWIFT ``megatron sft`` script as the Megatron-LM command line it runs (:mod:`.swift`)."""
    from . import megatron, swift
    argv, env = swift.swift_command(raw, text, env, path)
    world = world or swift.swift_world_size(env, path)
    if world is None:
        raise PartitaError(f"{path}: NPROC_PER_NODE / NNODES are not numbers in the script "
                           f"({env.get('NPROC_PER_NODE', '1')} x {env.get('NNODES', '1')}): pass --devices")
    mega = swift.megatron_argv(argv, fill.get("seq_len", seq_len), fill.get("dtype"), path)
    check_sizes(path, mega, megatron.MEGATRON_SIZES)
    fields, note = swift.swift_finetune(argv, swift.swift_subcommand(raw), True, path)
    plan = megatron.plan_from_megatron(mega, world, layers).with_(framework=swift.swift_framework(env), **fields)
    flags = megatron.read_megatron(mega, world, None, plan.framework, path).not_modelled  # Megatron's own
    rlhf = swift.swift_not_modelled(["--rlhf_type", swift.RLHF_DEFAULT]) \
        if swift.swift_subcommand(raw) == "rlhf" and not any(a.split("=")[0] == "--rlhf_type" for a in argv) else ()
    return plan, swift.swift_not_modelled(argv, megatron=True) + rlhf + swift.swift_spelling(flags) + \
        ((note,) if note else ())


def _swift_trainer(path: str, raw: str, world: int | None, seq_len: int | None, pp: int | None,
                   fill: dict[str, Any], env: dict[str, str]) -> tuple[Plan, tuple[str, ...]]:
    """ms-swift's ``swift sft --deepspeed X`` as the ds_config it runs (:func:`.swift.trainer_ds_config`)."""
    import os
    from . import deepspeed, swift
    argv, env = swift.swift_command(raw, expand_variables(raw), env, path, program="swift")
    world = world or swift.swift_world_size(env, path)
    if world is None:
        raise PartitaError(f"{path}: NPROC_PER_NODE / NNODES are not numbers in the script "
                           f"({env.get('NPROC_PER_NODE', '1')} x {env.get('NNODES', '1')}): pass --devices or --env")
    cfg, length = swift.trainer_ds_config(argv, world, os.path.dirname(os.path.abspath(path)), path)
    length = length or fill.get("seq_len", seq_len)
    if not length:
        raise PartitaError(f"{path}: the sequence length is the model's (no --max_length in the script): "
                           "pass --seq-len")
    deepspeed.check_ds_config(path, cfg)
    fields, note = swift.swift_finetune(argv, swift.swift_subcommand(raw), False, path)
    plan = deepspeed.plan_from_ds_config(cfg, world, length, pp, fill, path).with_(**fields)
    notes = ((note,) if note else ()) + (() if "--deepspeed" in argv else (swift.DDP_NOTE,))
    return plan, deepspeed.ds_not_modelled(cfg) + swift.swift_not_modelled(argv) + notes


def _openrlhf(path: str, raw: str, world: int | None, fill: dict[str, Any], env: dict[str, str],
              args: list[str] | tuple[str, ...]) -> tuple[Plan, tuple[str, ...]]:
    """OpenRLHF's ``deepspeed --module openrlhf.cli.train_sft ...`` as the ds_config it builds (:mod:`.openrlhf`)."""
    from . import deepspeed, openrlhf
    from .script import _run
    from .shell import launcher_world_size
    launcher, argv, trainer = openrlhf.trainer_argv(_run(path, raw, list(args), env, False).commands, path)
    world = world or launcher_world_size(launcher)
    if world is None:
        raise PartitaError(f"{path}: the launcher does not say how many devices ({' '.join(launcher)[:60] or 'none'}; "
                           "deepspeed without --num_gpus takes every GPU of the node): pass --devices")
    cfg, length, fields = openrlhf.ds_config(argv, path)
    deepspeed.check_ds_config(path, cfg)
    plan = deepspeed.plan_from_ds_config(cfg, world, length, None, fill, path).with_(**fields)
    return plan, deepspeed.ds_not_modelled(cfg) + openrlhf.not_modelled(argv, trainer)


def _dschat(path: str, raw: str, world: int | None, fill: dict[str, Any], env: dict[str, str],
            args: list[str] | tuple[str, ...]) -> tuple[Plan, tuple[str, ...]]:
    """DeepSpeed-Chat's ``deepspeed main.py ...`` as the ds_config main.py builds (:mod:`.dschat`)."""
    from . import deepspeed, dschat
    from .script import _run
    from .shell import launcher_world_size
    launcher, argv = dschat.trainer_argv(_run(path, raw, list(args), env, False).commands, path)
    dschat.check_trainer(argv, path)
    world = world or launcher_world_size(launcher)
    if world is None:
        raise PartitaError(f"{path}: the launcher does not say how many devices ({' '.join(launcher)[:60] or 'none'}; "
                           "deepspeed without --num_gpus takes every GPU of the node): pass --devices")
    cfg, length, fields = dschat.ds_config(argv, world, path)
    deepspeed.check_ds_config(path, cfg)
    plan = deepspeed.plan_from_ds_config(cfg, world, length, None, fill, path).with_(**fields)
    return plan, deepspeed.ds_not_modelled(cfg) + dschat.not_modelled(argv, path)


def check_sizes(path: str, argv: list[str], flags: tuple[str, ...], minus_one: tuple[str, ...] = ()) -> None:
    """Each numeric value of a size flag within 1..MAX_PLAN_SIZE (-1 where the framework fills it in);
    a non-numeric value is left to the framework's own parser (its error names the flag)."""
    from ..plan import MAX_PLAN_SIZE
    for i, tok in enumerate(argv):
        name, eq, inline = tok.partition("=")
        if name not in flags:
            continue
        value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if re.fullmatch(r"[+-]?\d+", value.strip()):
            number = int(value) if len(value) < 30 else MAX_PLAN_SIZE + 1
            if not (1 <= number <= MAX_PLAN_SIZE or (number == -1 and name in minus_one)):
                raise PartitaError(f"{path}: {name} {value[:30]} must be a whole number from 1 to {MAX_PLAN_SIZE:,}"
                                   + (" (or -1: fill)" if name in minus_one else ""))


def _need_world(path: str, world: int | None) -> int:
    if world is None:
        raise PartitaError(f"{path} does not say how many devices it runs on (no numeric torchrun --nproc-per-node); "
                           "pass --devices")
    return world


def load_config(path: str, source: str | None = None, devices: int | None = None, model: Any = None,
                seq_len: int | None = 2048, pp: int | None = None, fill: dict[str, Any] | None = None,
                env: dict[str, str] | None = None, args: list[str] | tuple[str, ...] = (),
                run_script: bool = False) -> Imported:
    """The :class:`Imported` plan of a launch file; every failure is a one-line :class:`PartitaError`
    (a file with several values left open: one line each). ``fill`` holds values the user gives
    for what the file leaves open (plan field -> value: DeepSpeed's "auto" mbs, gbs, dtype);
    ``seq_len`` is the length of a file that holds none (a ds_config, a Megatron-SWIFT script
    without --max_length); ``env`` the environment the user says the script runs in (``--env``),
    ``args`` its positional arguments (``--args``); a Megatron/MindSpeed script is read the way bash
    runs it (:mod:`.script`), executed only with ``run_script`` (``--run-script``, the user's consent)."""
    from ..plan import check
    reading = ""
    raw = read_text(path)
    target = source or detect(path, raw)
    text = raw if target in ("deepspeed", "llamafactory", "nanotron", "internevo") else expand_variables(raw)
    world = devices or script_world_size(text)
    from .flagscale import is_flagscale
    if target in ("megatron", "mindspeed") and is_flagscale(path, raw):  # Megatron's flags in YAML (.flagscale)
        from .flagscale import flagscale_command
        text, world, reading = flagscale_command(path, raw, devices)
    elif target in ("megatron", "mindspeed"):
        from .script import script_command
        read = script_command(path, raw, args, env, run_script, devices)  # None: no launch found, read as text
        text, world, reading = read if read is not None else (text, world, "")
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:  # argparse's usage block on a bad value
            plan, notes = _parse(target, path, text, world, model, seq_len, pp, fill or {}, raw, env or {}, args)
            model, note = _script_model(target, path, text, raw, model)
    except SystemExit:
        message = (err.getvalue().strip().splitlines() or ["bad argument"])[-1].split("error: ", 1)[-1]
        raise PartitaError(f"{path}: cannot read it as {target}: {message}") from None
    except (ValueError, TypeError, AttributeError, KeyError, ArithmeticError, RecursionError) as e:
        raise PartitaError(f"{path}: cannot read it as {target}: {type(e).__name__}: {e}"[:300]) from None
    except PartitaError as e:
        raise _with_reading(world_hint(e, devices, world if target in ("megatron", "mindspeed") else None),
                            reading) from None
    _check_fill(path, plan, dict(fill or {}, **({"pp": pp} if pp else {})))
    try:
        check(plan, model, devices)
    except PartitaError as e:
        raise _with_reading(world_hint(e, devices, world if target in ("megatron", "mindspeed") else None),
                            reading) from None
    return Imported(plan, target, notes, model, note, reading)


def _with_reading(error: PartitaError, reading: str) -> PartitaError:
    """``error`` with what the script's reading assumed (variables read unset, so empty as bash has
    them): a layout refused because an option the script takes from the environment was not given
    (Pai-Megatron-Patch's ``MP_PP0_LAYERS`` for an uneven pipeline split) names that variable too."""
    if not reading or "unset" not in reading:
        return error
    return PartitaError(f"{error} [{reading}]")


def _check_fill(path: str, plan: Plan, fill: dict[str, Any]) -> None:
    """A value the user gives (``fill``, ``--pp``) that the file sets otherwise is one line: the flags
    fill what a file leaves open ("auto"), they do not override what it says."""
    from ..plan import flag_name
    for name, value in fill.items():
        if getattr(plan, name) != value:
            raise PartitaError(f"{path} runs with {name} {getattr(plan, name)}; {flag_name(name)} {value} disagrees "
                               "(drop the flag: it only fills what the file leaves open)")


def _script_model(target: str, path: str, text: str, raw: str, given: Any) -> tuple[Any, str]:
    """(the model to estimate with, why the file gives none): a Megatron/MindSpeed command line's
    own model (:func:`partita.imports.megatron_model.model_from_megatron`), checked against
    ``--model`` (a contradiction is one line); other files define no model."""
    from . import megatron, swift
    if target == "internevo":
        from .internevo import model_note, read_assignments
        return (given, "") if given is not None else (None, model_note(read_assignments(raw, path)))
    if target == "nanotron":
        from .nanotron import model_from_nanotron
        from .yaml_file import read_yaml_mapping
        return (given, "") if given is not None else model_from_nanotron(
            read_yaml_mapping(raw, path, "a nanotron config"), path)
    if target == "llamafactory" and given is None:
        from .llamafactory import read_yaml
        name = read_yaml(raw, path).get("model_name_or_path")
        return None, f"the YAML names the model {name or '(none)'}: pass --model (a preset or its config.json)"
    from . import openrlhf
    if given is None and target == "deepspeed" and openrlhf.is_openrlhf(raw):
        found = re.search(r"--model\.model_name_or_path[= ]+(\S+)", raw)
        return None, (f"the script names the model {found.group(1) if found else '(none)'}: pass --model "
                      "(a preset or its config.json)")
    from . import dschat
    if given is None and target == "deepspeed" and dschat.is_dschat(raw):
        found = re.search(r"--model_name_or_path[= ]+(\S+)", raw)
        return None, (f"the script names the model {found.group(1) if found else '(none)'}: pass --model "
                      "(a preset or its config.json)")
    if given is None and (swift.is_swift(raw) or (target == "deepspeed" and swift.is_swift_trainer(raw))):
        found = re.search(r"--model[= ]+[\"']?([^\s\"'\\]+)", text)  # ms-swift's --model: a hub id or a path
        return None, (f"the script names the model {found.group(1) if found else '(none)'}: pass --model "
                      "(a preset or its config.json)")
    if target not in ("megatron", "mindspeed") or swift.is_swift(raw):
        return given, ""
    from .flagscale import is_flagscale, model_kind_note
    kind = model_kind_note(path, raw) if is_flagscale(path, raw) else ""
    if kind:
        return given, "" if given is not None else kind
    return megatron.resolve_model(argv_from_script(text), given, path)
