"""``partita import``: a launch file read back into a Partita plan (issue 14 item 2, issues 32-33).

What it reads (:mod:`partita.imports`; ``--from`` names the reader where detection does not):

- launch scripts of Megatron-LM, MindSpeed-LLM, Megatron-DeepSpeed (its ``--deepspeed_config``
  JSON too, where the script writes it or it lies beside the script), Pai-Megatron-Patch and
  Megatron-SWIFT (ms-swift ``megatron sft/pt``), and FlagScale's Hydra YAML;
- DeepSpeed: a ``ds_config.json``, DeepSpeed-Chat step-1/2 scripts, ms-swift Trainer scripts
  (``swift sft --deepspeed``) and OpenRLHF trainer scripts (the ds_config each builds);
- torchtitan overrides (``--section.field``) or its TOML; a LLaMA-Factory training YAML;
  a nanotron YAML config; an InternEvo ``.py`` config (its assignments, nothing executed).

The reading itself is :mod:`partita.imports` (the framework, the world size the script launches,
every failure one line, exit 2); this module parses the flags and prints. ``estimate --from-script``
and ``plan --from-script`` read the file with the same :func:`partita.imports.load_config`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from ..export.registry import importable_names
from ..imports import load_config
from ..inputs import MAX_DEGREE, MAX_SEQ_LEN
from .types import positive_int

load_script = load_config  # the name cli/estimate.py and cli/plan.py import


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="read a launch file into a plan: Megatron-LM / MindSpeed-LLM / "
                                      "Megatron-DeepSpeed / Pai-Megatron-Patch / Megatron-SWIFT scripts, FlagScale "
                                      "YAML, ds_config.json, DeepSpeed-Chat / ms-swift / OpenRLHF scripts, "
                                      "torchtitan overrides or TOML, LLaMA-Factory YAML, nanotron YAML, InternEvo .py")
    p.add_argument("script", metavar="FILE", help="launch script (Megatron-LM, MindSpeed-LLM, Megatron-DeepSpeed, "
                                                  "Pai-Megatron-Patch, Megatron-SWIFT, DeepSpeed-Chat, ms-swift, "
                                                  "OpenRLHF), ds_config.json, torchtitan overrides or TOML, "
                                                  "LLaMA-Factory / FlagScale / nanotron YAML or InternEvo .py config")
    p.add_argument("--devices", type=positive_int(MAX_DEGREE),
                   help="world size (default: the script's torchrun/deepspeed --nproc-per-node x --nnodes)")
    p.add_argument("--from", dest="source", choices=importable_names(), help="the file's framework (default: detected)")
    p.add_argument("--model", help="model preset or config.json: gives the layer count (vpp of torchtitan's "
                                   "layers_per_stage) and checks the plan against the model")
    p.add_argument("--seq-len", type=positive_int(MAX_SEQ_LEN),
                   help="sequence length of a ds_config (which does not hold one; default 2048) or of a "
                        "Megatron-SWIFT script without --max_length")
    p.add_argument("--pp", type=positive_int(MAX_DEGREE),
                   help="DeepSpeed: the PipelineModule(num_stages=...) of your model code")
    add_fill_flags(p)
    p.add_argument("-o", "--output", help="write the plan JSON here")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of the summary")
    p.add_argument("--hardware", help="also say whether the plan fits this device (the verdict estimate and plan "
                                      "give: partita.uncertainty), with the model the file defines or --model")
    add_script_flags(p)
    p.set_defaults(func=cmd_import)


def add_script_flags(p: argparse.ArgumentParser) -> None:
    """``--args``, ``--env``, ``--run-script``: what a launch script is run with (import, estimate and
    plan ``--from-script`` share them; docs/export.md "How a script is read")."""
    p.add_argument("--args", dest="script_args", action="append", default=[], metavar="'ARG ...'",
                   help="the script's positional arguments ($1 $2 ...), as one quoted string (repeatable)")
    p.add_argument("--env", dest="script_env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable the script reads (repeatable); unset ones are read as bash would")
    p.add_argument("--run-script", action="store_true",
                   help="run the script under bash to read it, with torchrun/python/deepspeed/srun/msrun replaced "
                        "by shims that record their arguments (no training runs; a scratch directory, a timeout); "
                        "default: read it without running it")


#: Plan fields a file may leave open for the user to give (DeepSpeed's "auto", the Hugging Face
#: Trainer's values): import offers them as flags, estimate/plan pass their plan flags of the same name.
FILL_FIELDS = ("mbs", "gbs", "dtype")


def add_fill_flags(p: argparse.ArgumentParser) -> None:
    """``--mbs``, ``--global-batch``, ``--dtype``: the values of a ds_config's "auto" (the flags and checks
    are the plan fields' own, :func:`partita.cli.plan_flags.plan_flag_kwargs`)."""
    from ..plan import field_meta, flag_dest
    from .plan_flags import plan_flag_kwargs
    for name in FILL_FIELDS:
        kwargs: dict[str, Any] = {"dest": flag_dest(name), "default": None,
                                  "help": f"{field_meta(name)['help']}, where the file says \"auto\""}
        p.add_argument(*plan_flag_kwargs(name, kwargs), **kwargs)


def fill_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """``{plan field: value}`` of the :data:`FILL_FIELDS` flags given (``load_config(fill=...)``)."""
    from ..plan import flag_dest
    return {name: getattr(args, flag_dest(name)) for name in FILL_FIELDS
            if getattr(args, flag_dest(name), None) is not None}


def not_modelled_lines(notes: tuple[str, ...]) -> list[str]:
    """``in the file, not modelled: ...`` lines, one per setting (what the estimate leaves out)."""
    return [f"in the file, not modelled: {note}" for note in notes]


def script_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`partita.imports.load_config` given by :func:`add_script_flags`."""
    import shlex
    from ..errors import PartitaError
    env: dict[str, str] = {}
    for item in args.script_env:
        name, eq, value = item.partition("=")
        if not eq or not name.isidentifier():
            raise PartitaError(f"--env {item[:60]}: give NAME=VALUE (a shell variable name)")
        env[name] = value
    try:
        positional = [a for text in args.script_args for a in shlex.split(text)]
    except ValueError as e:
        raise PartitaError(f"--args: {e} (quote the arguments as one string: --args 'CKPT 8')") from None
    return {"args": positional, "env": env, "run_script": args.run_script}


def cmd_import(args: argparse.Namespace) -> int:
    from ..inputs import check_output_path
    from ..spec.load import load_model
    from ..errors import PartitaError
    if args.model is not None and not args.model.strip():
        raise PartitaError("--model is empty; give a model name (see `partita models`) or a config.json path, "
                           "or leave --model out to use the model the script defines")
    model = load_model(args.model) if args.model else None
    if args.output is not None:
        check_output_path(args.output, "-o")
    read = load_config(args.script, args.source, args.devices, model, args.seq_len, args.pp, fill=fill_inputs(args),
                       **script_inputs(args))
    plan, target = read
    if args.output:
        from ..outputs import write_output
        write_output(args.output, plan.to_json() + "\n", "-o")
    script_model = read.model if model is None else None  # the model the file defines
    fit = fit_of(args, model or script_model, plan, read.model_note)
    if args.json:
        import json
        extra = {"not_modelled": list(read.not_modelled), "model": script_model.to_dict() if script_model else None,
                 "reading_note": read.reading_note, **fit}
        print(json.dumps({**plan.to_dict(), **extra}, indent=2))  # a plan file still (Plan.from_dict skips extra)
        return 0
    print(f"{args.script}: {target} launch config, {plan.world_size} devices, run as {plan.framework}")
    print(f"plan: {plan.summary()}, gbs {plan.gbs}, seq_len {plan.seq_len}, {plan.dtype}, schedule {plan.schedule}"
          + (f", layer split {','.join(map(str, plan.layer_split))}" if plan.layer_split else ""))
    if script_model is not None:
        print(f"model (the script's): {model_line(script_model)}")
    elif model is None and read.model_note:
        print(f"model: not read: {read.model_note}")
    for line in not_modelled_lines(read.not_modelled):
        print(line)
    if read.reading_note:
        print(f"note: {read.reading_note}")
    if fit:
        print(f"memory: {fit['memory_verdict']}")
    if args.output:
        print(f"wrote {args.output} (partita estimate --plan {args.output} ...)", file=sys.stderr)
    return 0


def fit_of(args: argparse.Namespace, model: Any, plan: Any, model_note: str = "") -> dict[str, Any]:
    """With ``--hardware``: the one memory verdict (:mod:`partita.uncertainty`, as estimate and plan
    say it) of the plan read, as JSON fields; {} without --hardware."""
    if not getattr(args, "hardware", None):
        return {}
    from ..errors import PartitaError
    if model is None:
        raise PartitaError(f"--hardware {args.hardware}: " + (model_note or "the file does not define the model; pass --model"))
    from ..estimate import estimate
    from ..spec.hardware import make_cluster
    est = estimate(model, make_cluster(args.hardware, plan.world_size), plan)
    return {key: est.to_dict()[key] for key in ("fits", "verdict", "p_fit", "memory_limit_gib", "memory_limit",
                                                "memory_verdict", "peak_memory_gib", "interval")}


def model_line(m: Any) -> str:
    """``80 layers, hidden 8192, 64 heads (8 kv), ffn 28672, vocab 128256, 70.6B parameters`` (+ MoE, MLA)."""
    text = (f"{m.layers} layers, hidden {m.hidden}, {m.heads} heads ({m.kv_heads} kv), ffn {m.ffn_hidden}, "
            f"vocab {m.vocab}")
    if m.moe:
        text += f", {m.moe.num_experts} experts top-{m.moe.top_k} (ffn {m.moe.expert_ffn_hidden})"
    if m.mla:
        text += f", MLA kv rank {m.mla.kv_lora_rank}"
    return text + f", {m.total_params() / 1e9:.1f}B parameters"


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
