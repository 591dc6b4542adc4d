"""The plan's command-line flags, generated from the :class:`~partita.plan.Plan` fields'
metadata (``partita.plan._flag``: flag name, aliases, allowed values or bounds, help,
the commands that offer it).

Why generated: a plan field, its flag and its check were written in three places
(cli/*, train/config.py, plan.py) and drifted - ``gbs`` was ``--global-batch`` only
through a bridge, some fields had no flag, the allowed values were typed again. Now a
field added to :class:`Plan` with flag metadata is a flag of ``partita estimate`` (and of
``partita plan`` when it names that command), and ``--tp 0`` is refused by the same
:func:`partita.plan.field_problem` as ``--plan tp=0`` and a plan file.

Every flag's default is None (unless the command asks for the plan's default), so that
:func:`plan_overrides` can tell a flag given from one left out: ``--plan`` beside a
degree flag is refused, and a flag left out takes the plan's own default
(:func:`partita.plan.plan_from_fields` fills dp, gbs, sp and the schedule).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Iterable

from ..errors import PartitaError
from ..plan import Plan, field_meta, field_value, flag_dest, flag_name, plan_fields_of, plan_from_fields


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(Plan)}


def plan_flag_type(name: str) -> Callable[[str], Any]:
    """The argparse ``type`` of field ``name``'s flag: the text as the field's type, checked by
    :func:`partita.plan.field_value` (argparse prefixes the flag: ``argument --tp: must be from
    1 to 16,777,216, got 0``). An empty list (``--layer-split ''``) is refused: leaving the
    flag out is how to give none."""
    def parse(text: str) -> Any:
        try:
            value = field_value(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value in (None, ()):
            raise argparse.ArgumentTypeError(f"is empty; give the {field_meta(name)['help']}")
        return value
    parse.__name__ = name  # argparse names the type in its "invalid <name> value" fallback
    return parse


def flag_fields(command: str) -> list[dataclasses.Field]:
    """The plan fields ``command`` offers as flags, in the plan's field order."""
    return [f for f in dataclasses.fields(Plan) if command in f.metadata["commands"]]


def plan_flag_kwargs(name: str, kwargs: dict[str, Any]) -> list[str]:
    """Make ``kwargs`` (for ``add_argument``) those of field ``name``'s flag - a switch
    (``--sp`` / ``--no-sp``) for a bool, else the plan's check as the ``type`` and its
    allowed values as the metavar - and return the flag's names (the flag, then its
    aliases). Also used for the train launcher's plan options (``plan_field`` metadata)."""
    meta = field_meta(name)
    kwargs.pop("choices", None)  # the type checks them, in the plan's words
    if _FIELD_TYPES[name] == "bool":
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = plan_flag_type(name)
        if meta["choices"] is not None:
            kwargs["metavar"] = "{" + ",".join(str(c) for c in meta["choices"]) + "}"
    return [flag_name(name), *meta["aliases"]]


def add_plan_flags(p: argparse.ArgumentParser, command: str, *, plan_defaults: Iterable[str] = (),
                   fixed: Iterable[str] = ()) -> None:
    """Add one flag per plan field ``command`` offers (its ``_flag`` metadata). A field in
    ``plan_defaults`` defaults to the plan's default, every other to None (not given); the
    help of a field in ``fixed`` (what the search would otherwise choose) starts "fix"."""
    plan_defaults, fixed = set(plan_defaults), set(fixed)
    for f in flag_fields(command):
        kwargs: dict[str, Any] = {"dest": flag_dest(f.name),
                                  "help": ("fix: " if f.name in fixed else "") + f.metadata["help"],
                                  "default": f.default if f.name in plan_defaults else None}
        p.add_argument(*plan_flag_kwargs(f.name, kwargs), **kwargs)


def plan_overrides(args: argparse.Namespace, command: str, exclude: Iterable[str] = ()) -> dict[str, Any]:
    """``{field: value}`` of the plan flags of ``command`` given in ``args`` (typed and
    checked already), less ``exclude``."""
    skip = set(exclude)
    return plan_fields_of(args, [f.name for f in flag_fields(command) if f.name not in skip])


def plan_from_flags(args: argparse.Namespace, command: str, world_size: int) -> Plan:
    """The plan the flags of ``command`` describe: the fields given, the rest filled by
    :func:`partita.plan.plan_from_fields` exactly as for a ``--plan`` string (dp fills
    ``--devices`` over tp*pp*cp). ``--framework`` is left to the caller (it applies to a
    plan file too)."""
    fields = plan_overrides(args, command, exclude=("framework",))
    if "gbs" not in fields:
        raise PartitaError(f"{flag_name('gbs')} is required (or pass --plan plan.json)")
    return plan_from_fields(fields, world_size, where="plan flags", world_name="--devices")


def refuse_plan_flags(args: argparse.Namespace, command: str, sources: dict[str, str | None],
                      allowed: Iterable[str] = ("framework", "seq_len")) -> None:
    """``sources`` (e.g. ``--plan``, ``--from-script``) each set the whole plan: two of them,
    or one beside a plan flag (which would be ignored), is refused in one line. The fields in
    ``allowed`` may accompany one (``--framework`` says how it is run; ``--seq-len`` has a
    default)."""
    given_sources = [f"{flag} {value}" for flag, value in sources.items() if value]
    if len(given_sources) > 1:
        raise PartitaError(f"{given_sources[0]} and {given_sources[1]} both set the plan; give one")
    if not given_sources:
        return
    given = [name for name in plan_overrides(args, command, exclude=allowed)
             if getattr(args, flag_dest(name)) is not False]  # a switch turned off (--no-sp) as before
    if given:
        first = given_sources[0]
        raise PartitaError(f"{first} already sets the plan; drop " + ", ".join(flag_name(g) for g in given)
                           + f" (or drop {first.split()[0]})")


def read_plan_arg(text: str, world_size: int | None = None, defaults: dict[str, Any] | None = None,
                  flag: str = "--plan") -> Plan:
    """The plan a ``--plan`` value names (a plan file, its JSON text, or ``dp=2,tp=4,...``):
    :meth:`partita.plan.Plan.parse`, the one reader every command uses; an empty value is
    one line naming ``flag``."""
    if not str(text).strip():
        raise PartitaError(f"{flag} is empty; give a plan file, its JSON, or fields such as tp=2,pp=2")
    return Plan.parse(text, world_size=world_size, defaults=defaults)
