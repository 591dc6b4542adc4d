"""torchtitan ``--section.field`` overrides and TOML files read back into a :class:`~partita.plan.Plan`
(issue 14 item 2; moved out of ``export/`` by issue 32), as torchtitan runs them (issue 32 item 5).

Facts from torchtitan (pytorch/torchtitan v0.2.2 ``torchtitan/config/job_config.py`` and
``models/llama3/infra/parallelize.py``; 0.3.0 ``config/configs.py`` has the same defaults):

- defaults: ``training.local_batch_size = 8``, ``seq_len = 2048``, ``global_batch_size = -1``
  (local x dp), ``data_parallel_shard_degree = -1`` (fills the devices), ``expert_tensor_parallel_degree
  = 1``, ``mixed_precision_param = "bfloat16"``, ``compile.enable = False``, ``compile.components =
  ["model", "loss"]``;
- ``fsdp_reshard_after_forward = "default"`` reshards after forward unless pipeline parallelism
  is on (``reshard_after_forward = not pp_enabled``): ZeRO-3, or ZeRO-2 with pp > 1;
- ``model.converters = ["float8"]`` (``"quantize.linear.float8"`` from v0.2) swaps the Linear
  layers for torchao's float8 ones: Partita's fp8; converters for the MoE grouped GEMMs only or
  MX formats are named as not modelled;
- compile decides how torchtitan runs a layer (``partita.cost.frameworks``): compiled blocks
  and loss are ``torchtitan``, compiled blocks with an eager loss ``torchtitan-eager-loss``, eager
  blocks ``torchtitan-eager``; v0.1's ``training.compile = true`` compiled both (the loss since
  torchtitan bbb1b616e, before v0.1.0); async TP (``enable_async_tensor_parallel``, in
  ``parallelism`` up to v0.2, ``compile`` in 0.3.0) is Partita's tp_comm_overlap.
"""
from __future__ import annotations

import re

from ..errors import PartitaError
from ..plan import Plan

#: Size flags of torchtitan overrides: each a whole number from 1.
TITAN_SIZES = ("--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
               "--parallelism.context_parallel_degree", "--parallelism.expert_parallel_degree",
               "--parallelism.data_parallel_shard_degree", "--parallelism.data_parallel_replicate_degree",
               "--parallelism.pipeline_parallel_layers_per_stage", "--parallelism.pipeline_parallel_microbatch_size",
               "--training.local_batch_size", "--training.global_batch_size", "--training.seq_len")
#: torchtitan fields where -1 means "fill" (its defaults).
TITAN_FILL = ("--parallelism.data_parallel_shard_degree", "--training.global_batch_size")


def _titan_values(argv: list[str]) -> tuple[dict, str]:
    """{"section.field": value} of tyro overrides (``--x`` True, ``--no_x`` False) and the AC subcommand."""
    values: dict = {}
    ac = "selective"  # Trainer.Config's default
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("activation_checkpoint:") or tok.startswith("activation-checkpoint:"):
            ac = tok.split(":", 1)[1]
        elif tok.startswith("--") and "=" in tok.split(".", 1)[-1]:  # --section.field=value
            key, _, value = tok[2:].partition("=")
            values[key] = value
        elif tok.startswith("--") and "." in tok:
            section, field = tok[2:].split(".", 1)
            if i + 1 < len(argv) and not argv[i + 1].startswith("--") and ":" not in argv[i + 1]:
                values[f"{section}.{field}"] = argv[i + 1]
                i += 1
            elif field.startswith("no_"):
                values[f"{section}.{field[3:]}"] = False
            else:
                values[f"{section}.{field}"] = True
        i += 1
    ac = str(values.pop("activation_checkpoint.mode", ac))  # v0.2's --activation_checkpoint.mode override
    return values, ac


def _on(value: object) -> bool:
    """A torchtitan boolean given as a TOML bool, a bare ``--x`` / ``--no_x`` or the text true/false."""
    return value is True or str(value).lower() in ("true", "1")


def titan_framework(v: dict) -> str:
    """The :mod:`partita.cost.frameworks` entry torchtitan's compile settings run as (module docstring)."""
    if not _on(v.get("compile.enable", v.get("training.compile", False))):
        return "torchtitan-eager"
    components = str(v.get("compile.components", "model,loss")).split(",")
    if "model" not in components:
        return "torchtitan-eager"
    return "torchtitan" if "loss" in components else "torchtitan-eager-loss"


#: Converters that make the Linear layers float8 (v0.1 name, v0.2 name).
_FLOAT8 = ("float8", "quantize.linear.float8")
#: Settings that change memory or time that the cost model does not hold (key, what it changes).
_NOT_MODELLED = (("float8.enable_fsdp_float8_all_gather", "FSDP all-gathers float8 weights (half the bytes)"),
                 ("quantize.linear.float8.enable_fsdp_float8_all_gather",
                  "FSDP all-gathers float8 weights (half the bytes)"))


def titan_not_modelled(argv: list[str], layers: int | None = None) -> tuple[str, ...]:
    """``"key value: what it changes"`` for the settings of ``argv`` the cost model does not hold:
    float8 weight all-gather (with the float8 converter on), converters other than float8 Linear, and
    layer SAC when the model's layer count (``layers``) is not known (:func:`_layer_sac`)."""
    v, ac = _titan_values(argv)
    option = str(v.get("activation_checkpoint.selective_ac_option", "op"))
    sac = [f"activation_checkpoint.selective_ac_option {option}: every {option}th block fully recomputed, the "
           "others none (read as selective; pass --model to count the blocks)"]
    sac = sac if ac == "selective" and option.isdigit() and layers is None else []
    converters = [c for c in str(v.get("model.converters", "")).split(",") if c]
    notes = [f"model.converters {c}: {'MX' if '.mx' in c or c == 'mx' else 'low-precision'} layers other than "
             "float8 Linear" for c in converters if c not in _FLOAT8]
    if any(c in _FLOAT8 for c in converters):
        notes += [f"{key} true: {what}" for key, what in _NOT_MODELLED if _on(v.get(key))]
    return tuple(notes + sac)


def plan_from_torchtitan(argv: list[str], layers: int | None = None) -> Plan:
    """The plan torchtitan overrides (0.3.0) or a TOML's settings (v0.1-v0.2) describe, unset fields
    at torchtitan's defaults (module docstring); ``layers`` gives the stage count of
    ``pipeline_parallel_layers_per_stage``."""
    v, ac = _titan_values(argv)
    num = lambda key, default=1: int(v.get(key, default))  # noqa: E731
    rep, shard = num("parallelism.data_parallel_replicate_degree"), num("parallelism.data_parallel_shard_degree")
    tp, pp = num("parallelism.tensor_parallel_degree"), num("parallelism.pipeline_parallel_degree")
    reshard = v.get("parallelism.fsdp_reshard_after_forward", "default")
    zero = 0 if shard == 1 else 2 if reshard == "never" or (reshard == "default" and pp > 1) else 3
    vpp, split = _stages(v, pp, layers)
    recompute, rc_layers = _layer_sac(v, ac, layers // (pp * vpp) if layers else None)
    dp = rep * shard
    local = num("training.local_batch_size", 8)
    mbs = num("parallelism.pipeline_parallel_microbatch_size") if pp > 1 else local
    gbs = num("training.global_batch_size", -1)
    param = v.get("training.mixed_precision_param", "bfloat16")
    converters = str(v.get("model.converters", "")).split(",")
    async_tp = any(_on(v.get(f"{section}.enable_async_tensor_parallel")) for section in ("parallelism", "compile"))
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=num("parallelism.context_parallel_degree"),
                ep=num("parallelism.expert_parallel_degree"), etp=num("parallelism.expert_tensor_parallel_degree"),
                sp=bool(v.get("parallelism.enable_sequence_parallel", True)), zero=zero, mbs=mbs,
                gbs=gbs if gbs > 0 else local * dp, seq_len=num("training.seq_len", 2048), recompute=recompute,
                recompute_layers=rc_layers,
                dtype="fp8" if set(converters) & set(_FLOAT8) else "fp32" if param == "float32" else "bf16",
                dp_shard=shard if rep > 1 and shard > 1 else 0, tp_comm_overlap=async_tp and tp > 1,
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", layer_split=split, framework=titan_framework(v))


def _layer_sac(v: dict, ac: str, chunk_layers: int | None) -> tuple[str, int]:
    """(recompute, recompute_layers) of torchtitan's activation checkpointing. ``selective`` with a
    number N (``selective_ac_option``, a TOML's default "2" up to v0.2) is layer SAC: every N-th block
    of a rank is fully checkpointed, the others keep everything (``_apply_layer_sac``: ``count % N == 0``;
    0 checkpoints all) - Partita's full recompute of ``chunk_layers // N`` layers per chunk. Without the
    layer count (no ``--model``) it stays ``selective``, and :func:`titan_not_modelled` names it."""
    option = str(v.get("activation_checkpoint.selective_ac_option", "op"))
    if ac != "selective" or not option.isdigit() or chunk_layers is None:
        return ac, 0
    every = int(option)
    if every <= 1:
        return "full", 0
    return ("full", chunk_layers // every) if chunk_layers // every else ("none", 0)


def _stages(v: dict, pp: int, layers: int | None) -> tuple[int, tuple[int, ...] | None]:
    """(vpp, layer split) of ``pipeline_parallel_layers_per_stage`` (torchtitan's first/last stage
    carry one layer less by default: the embedding and the output)."""
    lps = v.get("parallelism.pipeline_parallel_layers_per_stage")
    if pp == 1 or lps is None:
        return 1, None
    lps = int(lps)
    first = int(v.get("parallelism.pipeline_parallel_first_stage_less_layers", 1))
    last = int(v.get("parallelism.pipeline_parallel_last_stage_less_layers", 1))
    if layers is None:
        raise PartitaError("torchtitan's pipeline_parallel_layers_per_stage needs the model's layer count: "
                           "pass --model")
    stages = -(-(layers + first + last) // lps)
    split = (lps - first,) + (lps,) * (stages - 2) + (lps - last,) if first or last else None
    return stages // pp, split


def toml_argv(path: str, text: str) -> list[str]:
    """A torchtitan TOML as ``--section.field value`` overrides (booleans as ``--x`` / ``--no_x``)."""
    import tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PartitaError(f"{path} is not valid TOML: {e}") from None
    except RecursionError:
        raise PartitaError(f"{path} is nested too deeply to be a torchtitan TOML") from None
    argv: list[str] = []
    for key, value in _flatten(data):
        section, _, field = key.rpartition(".")
        if key == "activation_checkpoint.mode":
            argv.append(f"activation_checkpoint:{value}")
            if value == "selective" and "selective_ac_option" not in data["activation_checkpoint"]:
                argv += ["--activation_checkpoint.selective_ac_option", "2"]  # up to v0.2 the default is layer SAC
        elif isinstance(value, bool):
            argv.append(f"--{section}.{'' if value else 'no_'}{field}")
        elif isinstance(value, list):
            argv += [f"--{key}", ",".join(map(str, value))]
        elif "." in key:
            argv += [f"--{key}", str(value)]
    return argv


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``[("section.sub.field", value), ...]`` of a TOML's nested tables (``[quantize.linear.float8]``)."""
    items: list[tuple[str, object]] = []
    for name, value in data.items():
        key = f"{prefix}{name}"
        items += _flatten(value, key + ".") if isinstance(value, dict) else [(key, value)]
    return items


def titan_plan(argv: list[str], world: int | None, layers: int | None) -> Plan:
    """torchtitan's plan; an unset or -1 ``data_parallel_shard_degree`` (torchtitan's default, -1) fills
    the world size left by the other degrees, as ``ParallelDims`` does, when the world size is known."""
    flag = "--parallelism.data_parallel_shard_degree"
    given = [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok == flag]
    if given and given[-1] != "-1":
        return plan_from_torchtitan(argv, layers)
    if world is None:
        raise PartitaError(f"torchtitan's data_parallel_shard_degree is {'-1' if given else 'unset'} (fill the "
                           "devices): pass --devices")
    others = plan_from_torchtitan(argv + [flag, "1"], layers).world_size
    if others < 1:
        raise PartitaError(f"the parallel degrees multiply to {others}; each must be at least 1")
    if world % others:
        raise PartitaError(f"--devices {world} is not a multiple of the other degrees' product {others}")
    return plan_from_torchtitan(argv + [flag, str(world // others)], layers)


#: The training entry point of a torchtitan launch (``-m torchtitan.train``; run_train.sh's TRAIN_FILE).
TITAN_ENTRY = re.compile(r"(^|[/.])torchtitan\.train$")
#: ``--job.config_file`` (torchtitan up to v0.2: the TOML the overrides after it apply to).
_CONFIG_FILE = ("--job.config_file", "--job.config-file")


def script_argv(raw: str, path: str, env: dict[str, str], args: list[str] | tuple[str, ...]) -> \
        tuple[list[str], int | None] | None:
    """(the overrides after ``-m torchtitan.train``, the launcher's world size or None) of a launch
    script read as bash runs it (:mod:`.shell`: run_train.sh's ``${CONFIG_FILE:-...}``, ``"$@"``
    from ``args``); None when no command launches torchtitan (an overrides file)."""
    from .shell import ShellError, find_launch, launcher_world_size, read_script
    try:
        launch = find_launch(read_script(raw, args, env, path), TITAN_ENTRY)
    except ShellError:
        return None
    return (launch[1], launcher_world_size(launch[0])) if launch else None


def with_config_file(argv: list[str], path: str) -> list[str]:
    """``argv`` with the TOML its ``--job.config_file`` names read first (the overrides after it win, as
    in torchtitan's ConfigManager); the file is looked for as given, then next to the script."""
    import os
    for i, word in enumerate(argv):
        name, eq, inline = word.partition("=")
        if name in _CONFIG_FILE:
            toml = inline if eq else argv[i + 1] if i + 1 < len(argv) else ""
            found = [f for f in (toml, os.path.join(os.path.dirname(os.path.abspath(path)), toml)) if os.path.isfile(f)]
            if not found:
                raise PartitaError(f"{path}: --job.config_file {toml[:100]}: no such file (as given or next to the "
                                   "script); run partita where the path holds, or import the TOML itself")
            from .detect import read_text
            return toml_argv(found[0], read_text(found[0])) + argv
    return argv
