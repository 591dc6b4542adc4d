"""``partita import``: a Megatron-LM / MindSpeed-LLM launch script, a DeepSpeed ``ds_config.json``
or torchtitan overrides / TOML read back into a Partita plan (issue 14 item 2).

The reading itself is :mod:`partita.export.importers`; this module finds the file's framework,
the world size the script launches, and turns every failure into one line (exit 2).
``estimate --from-script`` and ``plan --from-script`` use :func:`load_script` too.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import sys
from typing import Any

from ..errors import PartitaError
from ..export.registry import importable_names
from ..inputs import MAX_DEGREE, MAX_SEQ_LEN
from .types import positive_int

#: torchrun / torch.distributed.run / deepspeed launcher flags giving ranks per node and nodes.
_PER_NODE = ("--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus")
_NODES = ("--nnodes", "--num_nodes", "--num-nodes")


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="read a Megatron/MindSpeed launch script, a ds_config.json or torchtitan "
                                      "overrides into a plan")
    p.add_argument("script", metavar="FILE", help="launch script, ds_config.json, torchtitan overrides or TOML")
    p.add_argument("--devices", type=positive_int(MAX_DEGREE),
                   help="world size (default: the script's torchrun/deepspeed --nproc-per-node x --nnodes)")
    p.add_argument("--from", dest="source", choices=importable_names(), help="the file's framework (default: detected)")
    p.add_argument("--model", help="model preset or config.json: gives the layer count (vpp of torchtitan's "
                                   "layers_per_stage) and checks the plan against the model")
    p.add_argument("--seq-len", type=positive_int(MAX_SEQ_LEN), default=2048,
                   help="sequence length of a ds_config (which does not hold one; default 2048)")
    p.add_argument("--pp", type=positive_int(MAX_DEGREE),
                   help="DeepSpeed: the PipelineModule(num_stages=...) of your model code")
    p.add_argument("-o", "--output", help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of the summary")
    p.set_defaults(func=cmd_import)


def read_text(path: str) -> str:
    """The file's text, or a one-line error (missing, a directory, not UTF-8)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise PartitaError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise PartitaError(f"{path} is a directory; give the launch script or config file") from None
    except UnicodeDecodeError:
        raise PartitaError(f"{path} is not a UTF-8 text file (a launch script or config is expected)") from None
    except OSError as e:
        raise PartitaError(f"cannot read {path}: {e.strerror}") from None


def detect(path: str, text: str) -> str:
    """The framework a file is written for, from its content (and a ``.json``/``.toml`` name)."""
    stripped = text.lstrip()
    if stripped.startswith("{") or path.endswith(".json"):
        if re.search(r'"(zero_optimization|train_batch_size|train_micro_batch_size_per_gpu)"', text):
            return "deepspeed"
    if path.endswith(".toml") or re.search(r"--(parallelism|training)\.", text):
        return "torchtitan"
    if re.search(r"mindspeed|--use-ascend-mc2|--use-fused-rmsnorm", text, re.IGNORECASE):
        return "mindspeed"
    if re.search(r"pretrain_gpt\.py|--tensor-model-parallel-size|--pipeline-model-parallel-size", text):
        return "megatron"
    raise PartitaError(f"{path}: not a recognised launch config (no pretrain_gpt.py / --tensor-model-parallel-size "
                       "for Megatron, no zero_optimization / train_batch_size for DeepSpeed, no --parallelism.* / "
                       "--training.* for torchtitan); name it with --from")


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


def _toml_argv(path: str, text: str) -> list[str]:
    """A torchtitan TOML as ``--section.field value`` overrides (booleans as ``--x`` / ``--no_x``)."""
    import tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PartitaError(f"{path} is not valid TOML: {e}") from None
    except RecursionError:
        raise PartitaError(f"{path} is nested too deeply to be a torchtitan TOML") from None
    argv: list[str] = []
    for section, fields in data.items():
        if not isinstance(fields, dict):
            continue
        for field, value in fields.items():
            if section == "activation_checkpoint" and field == "mode":
                argv.append(f"activation_checkpoint:{value}")
            elif isinstance(value, bool):
                argv.append(f"--{section}.{'' if value else 'no_'}{field}")
            elif not isinstance(value, (dict, list)):
                argv += [f"--{section}.{field}", str(value)]
    return argv


def _parse(target: str, path: str, text: str, world: int | None, layers: int | None, seq_len: int, pp: int | None):
    """The importer of ``target`` on the file's text (world size checked by the caller)."""
    from ..export import importers
    if path.endswith(".toml") and target == "torchtitan":
        text = " ".join(_toml_argv(path, text))  # TOML errors first, then the same checks as overrides
    _check_kind(target, path, text)
    if target == "deepspeed":
        from ..inputs import read_json
        cfg = read_json(path, "DeepSpeed config")  # size, UTF-8, depth, NaN/Infinity: one line each
        if not isinstance(cfg, dict):
            raise PartitaError(f"{path} must hold a JSON object (a DeepSpeed config)")
        _check_ds_config(path, cfg)
        return importers.plan_from_ds_config(cfg, _need_world(path, world), seq_len=seq_len, pp=pp)
    if target == "torchtitan":
        argv = importers.argv_from_script(text, "torchtitan.train")
        _check_sizes(path, argv, _TITAN_SIZES, minus_one=_TITAN_FILL)
        return _titan_plan(argv, world, layers)
    argv = importers.argv_from_script(text)
    _check_sizes(path, argv, _MEGATRON_SIZES)
    return importers.plan_from_megatron(argv, _need_world(path, world), layers)


#: Size flags of a Megatron/MindSpeed command line: each a whole number from 1 (a 0 divides by zero).
_MEGATRON_SIZES = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                   "--expert-model-parallel-size", "--micro-batch-size", "--global-batch-size", "--seq-length",
                   "--num-layers", "--num-layers-per-virtual-pipeline-stage", "--virtual-pipeline-model-parallel-size")
_TITAN_SIZES = ("--parallelism.tensor_parallel_degree", "--parallelism.pipeline_parallel_degree",
                "--parallelism.context_parallel_degree", "--parallelism.expert_parallel_degree",
                "--parallelism.data_parallel_shard_degree", "--parallelism.data_parallel_replicate_degree",
                "--parallelism.pipeline_parallel_layers_per_stage", "--parallelism.pipeline_parallel_microbatch_size",
                "--training.local_batch_size", "--training.global_batch_size", "--training.seq_len")
#: torchtitan fields where -1 means "fill" (its defaults).
_TITAN_FILL = ("--parallelism.data_parallel_shard_degree", "--training.global_batch_size")


def _check_sizes(path: str, argv: list[str], flags: tuple[str, ...], minus_one: tuple[str, ...] = ()) -> None:
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


#: DeepSpeed config keys the importer reads, and their JSON types.
_DS_INTS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
_DS_OBJECTS = ("pipeline", "tensor_parallel", "bf16", "fp16", "zero_optimization")


def _check_ds_config(path: str, cfg: dict) -> None:
    """The fields :func:`partita.export.importers.plan_from_ds_config` reads have DeepSpeed's types."""
    from ..plan import MAX_PLAN_SIZE
    for key in _DS_OBJECTS:
        if key in cfg and not isinstance(cfg[key], dict):
            raise PartitaError(f"{path}: {key} must be a JSON object, got {cfg[key]!r}"[:200])
    ints = [(key, cfg.get(key)) for key in _DS_INTS]
    ints += [("pipeline.stages", cfg.get("pipeline", {}).get("stages")),
             ("tensor_parallel.autotp_size", cfg.get("tensor_parallel", {}).get("autotp_size")),
             ("zero_optimization.stage", cfg.get("zero_optimization", {}).get("stage"))]
    for key, value in ints:
        if value is None or (key == "pipeline.stages" and isinstance(value, str)):  # "auto" / unset
            continue
        low = 0 if key in ("zero_optimization.stage", "tensor_parallel.autotp_size") else 1
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_PLAN_SIZE:
            raise PartitaError(f"{path}: {key} must be a whole number from {low} to {MAX_PLAN_SIZE:,}, "
                               f"got {value!r}"[:200])


def _titan_plan(argv: list[str], world: int | None, layers: int | None):
    """torchtitan's plan; an unset or -1 ``data_parallel_shard_degree`` (torchtitan's default, -1) fills
    the world size left by the other degrees, as ``ParallelDims`` does, when the world size is known."""
    from ..export import importers
    flag = "--parallelism.data_parallel_shard_degree"
    given = [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok == flag]
    if given and given[-1] != "-1":
        return importers.plan_from_torchtitan(argv, layers)
    if world is None:
        raise PartitaError(f"torchtitan's data_parallel_shard_degree is {'-1' if given else 'unset'} (fill the "
                           "devices): pass --devices")
    others = importers.plan_from_torchtitan(argv + [flag, "1"], layers).world_size
    if others < 1:
        raise PartitaError(f"the parallel degrees multiply to {others}; each must be at least 1")
    if world % others:
        raise PartitaError(f"--devices {world} is not a multiple of the other degrees' product {others}")
    return importers.plan_from_torchtitan(argv + [flag, str(world // others)], layers)


#: What a file must contain to be read as each framework's (else the importer would return defaults).
_MARKERS = {"megatron": (r"--(tensor|pipeline)-model-parallel-size|--micro-batch-size|--global-batch-size",
                         "no --tensor-model-parallel-size, --pipeline-model-parallel-size or batch flag"),
            "torchtitan": (r"--(parallelism|training)\.", "no --parallelism.* or --training.* setting"),
            "deepspeed": (r"\"(zero_optimization|train_batch_size|train_micro_batch_size_per_gpu)\"",
                          "no zero_optimization or batch key")}


def _check_kind(target: str, path: str, text: str) -> None:
    pattern, missing = _MARKERS["megatron" if target == "mindspeed" else target]
    if not re.search(pattern, text):
        raise PartitaError(f"{path} does not look like a {target} launch config ({missing}); check the file or --from")


def _need_world(path: str, world: int | None) -> int:
    if world is None:
        raise PartitaError(f"{path} does not say how many devices it runs on (no numeric torchrun --nproc-per-node); "
                           "pass --devices")
    return world


def load_script(path: str, source: str | None = None, devices: int | None = None, model: Any = None,
                seq_len: int = 2048, pp: int | None = None):
    """(plan, framework) of a launch file; every failure is a one-line :class:`PartitaError`."""
    from ..plan import check
    raw = read_text(path)
    target = source or detect(path, raw)
    text = raw if target == "deepspeed" else expand_variables(raw)
    world = devices or script_world_size(text)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:  # argparse's usage block on a bad value
            plan = _parse(target, path, text, world, model.layers if model else None, seq_len, pp)
    except SystemExit:
        message = (err.getvalue().strip().splitlines() or ["bad argument"])[-1].split("error: ", 1)[-1]
        raise PartitaError(f"{path}: cannot read it as {target}: {message}") from None
    except (ValueError, TypeError, AttributeError, KeyError, ArithmeticError, RecursionError) as e:
        raise PartitaError(f"{path}: cannot read it as {target}: {type(e).__name__}: {e}"[:300]) from None
    check(plan, model, devices)
    return plan, target


def cmd_import(args: argparse.Namespace) -> int:
    from ..inputs import check_output_path
    from ..spec.load import load_model
    model = load_model(args.model) if args.model else None
    if args.output is not None:
        check_output_path(args.output, "-o")
    plan, target = load_script(args.script, args.source, args.devices, model, args.seq_len, args.pp)
    if args.output:
        from ..outputs import write_output
        write_output(args.output, plan.to_json() + "\n", "-o")
    if args.json:
        print(plan.to_json())
        return 0
    print(f"{args.script}: {target} launch config, {plan.world_size} devices")
    print(f"plan: {plan.summary()}, gbs {plan.gbs}, seq_len {plan.seq_len}, {plan.dtype}, schedule {plan.schedule}"
          + (f", layer split {','.join(map(str, plan.layer_split))}" if plan.layer_split else ""))
    if args.output:
        print(f"wrote {args.output} (partita estimate --plan {args.output} ...)", file=sys.stderr)
    return 0


#: Plan fields a user's launch config and the searched best can differ in (named in the comparison).
_COMPARED = ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero", "mbs", "recompute", "dtype", "layer_split",
             "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather")


def _seconds(x: float) -> str:
    return f"{x:.3g} s/step"


def _differences(yours, best) -> str:
    """``tp 8 (yours 4), zero 1 (yours 3)``: the best plan's value of every knob that differs."""
    tp_only = ("sp", "tp_comm_overlap")  # mean nothing without tensor parallelism
    diffs = [f"{k} {_show(getattr(best, k))} (yours {_show(getattr(yours, k))})" for k in _COMPARED
             if getattr(best, k) != getattr(yours, k) and (k not in tp_only or min(best.tp, yours.tp) > 1)]
    return ", ".join(diffs) or "the same layout"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) if len(value) <= 8 else f"{len(value)} uneven stages"
    if value is None:
        return "even"
    return str(value)


def _biggest_extra(yours, best) -> str:
    """The step-time part the user's plan spends most extra time on, like ``why_not`` names it."""
    keys = list(dict.fromkeys([*yours.time.parts, *best.time.parts]))
    key = max(keys, key=lambda k: yours.time.parts.get(k, 0.0) - best.time.parts.get(k, 0.0))
    extra = yours.time.parts.get(key, 0.0) - best.time.parts.get(key, 0.0)
    return f"your plan's largest extra is {key} (+{extra:.3g} s, {yours.time.parts.get(key, 0.0) / yours.step_time_s:.0%} of its step)"


def comparison(yours, best, memory_limit_gib: float) -> str:
    """One line comparing the user's imported plan (an Estimate) with the searched best (an Estimate),
    judged against the search's memory limit (its headroom included)."""
    yours.memory_limit = memory_limit_gib
    head = f"your plan ({yours.plan.summary()}): "
    best_text = f"best ({best.plan.summary()}): {_seconds(best.step_time_s)}"
    if not yours.fits:
        return (f"{head}{yours.memory_verdict} (the search's limit, --headroom included); {best_text}, "
                f"it differs in {_differences(yours.plan, best.plan)}")
    ratio = yours.step_time_s / best.step_time_s - 1
    if ratio < 0:
        return (f"{head}{_seconds(yours.step_time_s)}, {-ratio:.0%} faster than the searched {best_text}: "
                "your plan is outside the searched space (fixed knobs, --no-zero3/--no-recompute or the layouts "
                f"searched); it differs in {_differences(yours.plan, best.plan)}")
    if ratio < 0.005:
        return f"{head}{_seconds(yours.step_time_s)}; {best_text}: your plan is as fast as the best found"
    return (f"{head}{_seconds(yours.step_time_s)}; {best_text} ({ratio:.0%} faster): best differs in "
            f"{_differences(yours.plan, best.plan)}; {_biggest_extra(yours, best)}")
