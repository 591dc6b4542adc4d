"""What several commands share: the model/cluster flags and their loading, token counts,
and the flags generated from a config dataclass (:func:`add_config_arguments`)."""
from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from typing import Any, TypeVar

from ..errors import PartitaError
from ..inputs import MAX_DEGREE, MAX_DEVICES_PER_NODE
from .types import positive_int

C = TypeVar("C")


def parse_tokens(text: str) -> float:
    """``1.4T`` -> 1.4e12; accepts K/M/B/G/T suffixes or a plain number (positive, finite,
    at most 1e18 tokens: beyond any training run)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+]?[0-9]+)?)\s*([kmbgt]?)\s*", str(text).lower())
    if not m:
        raise PartitaError(f"--tokens {text!r} must be a positive number like 1.4T, 300B or 2e12")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}[m.group(2)]
    value = float(m.group(1)) * scale
    if not 0 < value <= 1e18:
        raise PartitaError(f"--tokens {text!r} must be more than 0 and at most 1e18 (1,000,000T) tokens")
    return value


def tokens_arg(text: str) -> str:
    """argparse type of ``--tokens``: checked now, kept as the text (see :func:`parse_tokens`)."""
    try:
        parse_tokens(text)
    except PartitaError:
        raise argparse.ArgumentTypeError(f"must be a positive number of tokens up to 1e18, like 1.4T, 300B or "
                                         f"2e12; got {text!r}") from None
    return text


def add_cluster_args(p: argparse.ArgumentParser, defaults: bool = False) -> None:
    """Model and hardware flags of ``plan`` (with the default scenario) and ``estimate``."""
    p.add_argument("--model", help="preset name (partita models) or a config.json path"
                   + (" (default llama-65b)" if defaults else "") + "; optional with --from-script when the script "
                   "defines the model (Megatron/MindSpeed --num-layers, --hidden-size, ...)")
    p.set_defaults(default_model="llama-65b" if defaults else None)
    p.add_argument("--hardware", default="ascend-910b2" if defaults else None, required=not defaults,
                   help="device name (partita hardware) or a device/cluster JSON file")
    p.add_argument("--devices", type=positive_int(MAX_DEGREE),
                   help="number of devices" + (" (default: the --from-script file's world size, else the hardware "
                                               "file's cluster, else 512)" if defaults else
                                               " (default with --from-script: the world size the script launches)"))
    if defaults:
        p.set_defaults(default_devices=512)
    p.add_argument("--devices-per-node", type=positive_int(MAX_DEVICES_PER_NODE), help="devices per node (default: the device file's)")
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", dest="overrides",
                   help="override a hardware field, e.g. --set inter_node.gbps_per_direction=25")
    p.add_argument("--tokens", type=tokens_arg, help="total training tokens, e.g. 1.4T: print run days and device-hours")
    from .finetune_data import add_dataset_args
    add_dataset_args(p)  # --seq-lengths, --epochs: a fine-tuning dataset's packing and days (issue 36)
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    # the plan's own flags (--global-batch, --seq-len, --dtype, --framework, the degrees, ...)
    # are generated from the Plan fields by partita.cli.plan_flags.add_plan_flags


def framework_arg(args: argparse.Namespace) -> str | None:
    """The ``--framework`` name (checked by its flag against the plan's frameworks), or None."""
    return getattr(args, "framework", None)


def cluster_and_model(args: argparse.Namespace):
    """The model spec and cluster the flags of :func:`add_cluster_args` name."""
    from ..spec.hardware import make_cluster, parse_overrides
    from ..spec.load import load_model
    name = _model_name(args)
    for flag, value in (("--model", name), ("--hardware", args.hardware)):
        if value is not None and (not value or not value.strip()):
            raise PartitaError(f"{flag} is empty; give a name (see `partita {'models' if flag == '--model' else 'hardware'}`)"
                               " or a JSON file")
    model = load_model(name) if name is not None else None  # None: the --from-script file's own model
    devices = args.devices
    overrides = parse_overrides(args.overrides)
    if devices is None and getattr(args, "from_script", None):
        devices = _script_world_size(args)  # nnodes x nproc_per_node of the launcher, else one line naming --devices
    if devices is None and not (_names_a_cluster(args.hardware) or "nodes" in (overrides.get("cluster") or {})):
        devices = getattr(args, "default_devices", None)  # a cluster's nodes win over the default scenario
        if devices is None:
            raise PartitaError("--devices is required (the number of devices; with --from-script, a script whose "
                               "launcher gives nnodes x nproc-per-node needs none)")
    try:
        cluster = make_cluster(args.hardware, devices, args.devices_per_node, overrides)
    except PartitaError as e:
        raise _blame_override(e, overrides) from None
    return model if model is not None else _script_model(args, cluster.world_size), cluster


def _script_world_size(args: argparse.Namespace) -> int:
    """The world size the ``--from-script`` file launches (``torchrun --nnodes N --nproc-per-node M``,
    ``GPUS_PER_NODE`` x ``NNODES``, ms-swift's ``NPROC_PER_NODE`` ...), as the file is read for its
    plan; a file that does not give one (a ds_config) is one line naming ``--devices``."""
    from ..imports import load_config
    from .import_cmd import fill_inputs, script_inputs
    read = load_config(args.from_script, seq_len=getattr(args, "seq_len", None), fill=fill_inputs(args),
                       pp=getattr(args, "pp", None), **script_inputs(args))
    return read.plan.world_size


def _script_model(args: argparse.Namespace, world_size: int):
    """The model the ``--from-script`` file defines (no ``--model``), or one line naming what the
    file lacks and the flag that supplies it."""
    from ..imports import load_config
    from .import_cmd import script_inputs
    read = load_config(args.from_script, devices=world_size, seq_len=getattr(args, "seq_len", None),
                       **script_inputs(args))
    if read.model is None:
        raise PartitaError(f"{args.from_script}: " + (read.model_note or "the file does not define the model (no "
                           "--num-layers / --hidden-size / --num-attention-heads): pass --model"))
    return read.model


def _model_name(args: argparse.Namespace) -> str | None:
    """``--model``, else None where ``--from-script`` names a file whose own model is used
    (partita.imports reads it, and refuses in one line a file that defines none), else the
    command's default model, else a one-line refusal."""
    if args.model is not None or getattr(args, "from_script", None):
        return args.model
    if getattr(args, "default_model", None):
        return args.default_model
    raise PartitaError("--model is required: a preset (partita models), a config.json, or --from-script with a "
                       "launch script that defines the model")


def _blame_override(error: PartitaError, overrides: dict) -> PartitaError:
    """An error about a field that ``--set`` changed names the ``--set``, not the device file."""
    text = str(error)
    for section, values in overrides.items():
        for name in values:
            path = f"{section}.{name}"
            if f": {path} " in text:
                return PartitaError(f"--set {path}=...: {path} {text.split(f': {path} ', 1)[1]}")
    return error


def _names_a_cluster(hardware: str) -> bool:
    """Whether ``--hardware`` is a JSON file with a ``cluster`` section (its node count)."""
    if not hardware.endswith(".json"):
        return False
    from ..inputs import read_json
    data = read_json(hardware, "hardware")
    return isinstance(data, dict) and bool(data.get("cluster"))


def _checked_type(kind: type, bounds: tuple[float, float] | None) -> Any:
    """The argparse type of a generated flag: ints within ``bounds`` (default: a 32-bit
    range, what seeds and counts fit), floats finite and within ``bounds`` (a field's
    ``option(..., bounds=(low, high))`` metadata), strings as given."""
    from .types import finite_float, positive_int
    if kind is int:
        low, high = bounds or (-(1 << 31), (1 << 31) - 1)
        return positive_int(int(high), minimum=int(low))
    if kind is float:
        low, high = bounds or (-math.inf, math.inf)
        return finite_float(low, high, min_open=False)
    return kind


def _flag_type(hint: Any) -> type:
    """``int``, ``float``, ``str`` or ``bool`` from a field's annotation (``X | None`` -> X)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint not in (int, float, str, bool):
        raise TypeError(f"no command-line flag for a field of type {hint!r}")
    return hint


def add_config_arguments(p: argparse.ArgumentParser, cls: type, command: str) -> None:
    """One flag per field of the dataclass ``cls`` that ``command`` offers (its ``option``
    metadata: help, choices, commands, flag). A boolean that defaults to False is a
    ``--flag`` switch, one that defaults to True gets ``--flag`` / ``--no-flag``; a field
    without a default is a required flag. The flags' dests are the field names."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if command not in meta.get("commands", ()):
            continue
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        kind = _flag_type(hints[f.name])
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta.get("help")}
        names = [flag]
        if kind is bool:
            kwargs.update(action=argparse.BooleanOptionalAction if f.default is True else "store_true",
                          default=bool(f.default))
        else:
            kwargs.update(type=_checked_type(kind, meta.get("bounds")), required=required)
            if not required:
                kwargs["default"] = f.default
            if meta.get("choices"):
                kwargs["choices"] = list(meta["choices"])
        if meta.get("plan_field"):  # a plan field's flag: the plan's check and aliases (cli/plan_flags.py)
            from .plan_flags import plan_flag_kwargs
            names += [a for a in plan_flag_kwargs(meta["plan_field"], kwargs) if a != flag]
        p.add_argument(*names, **kwargs)


def config_from_args(cls: type[C], args: argparse.Namespace, **changes: Any) -> C:
    """An instance of the dataclass ``cls`` from the parsed flags (fields that are not
    flags keep their defaults), with ``changes`` applied."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values.update(changes)
    return cls(**values)
