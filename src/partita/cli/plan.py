"""``partita plan``: search for the best plans and say why not the others (the logic is in
:mod:`partita.search`; this module wires the flags and prints)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..errors import PartitaError
from ..export.registry import target_names
from ..inputs import MAX_TOP
from ..search.space import SearchSpace
from ..search.recompute_modules import applies as module_lists_apply  # Megatron's --recompute-modules lists
from ..uncertainty import DEFAULT_HEADROOM, DEFAULT_MIN_P_FIT
from .types import finite_float, positive_int
from .common import add_cluster_args, cluster_and_model, framework_arg, parse_tokens
from .import_cmd import add_script_flags, fill_inputs, not_modelled_lines, script_inputs
from .plan_flags import add_plan_flags, read_plan_arg
from .plan_report import add_report_arg
from .traced import add_trace_args, cmd_plan_traced, is_traced

DEFAULT_SCENARIO = ("LLaMA-65B on 512 Ascend 910B NPUs (64 nodes x 8, HCCS inside, RoCE between), "
                    "2048-token sequences, 4M-token global batch (2048 sequences), 1.4T tokens")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="search for the best plan (no arguments: " + DEFAULT_SCENARIO + ")")
    add_cluster_args(p, defaults=True)
    add_plan_flags(p, "plan", plan_defaults=("seq_len", "powersgd_rank"),
                   fixed=[f.name for f in dataclasses.fields(SearchSpace)])
    p.set_defaults(global_batch=None, tokens="1.4T")  # None: DEFAULT_GLOBAL_BATCH unless your plan gives one
    p.add_argument("--top", type=positive_int(MAX_TOP), default=5, help="how many plans to show")
    p.add_argument("--no-zero3", action="store_true", help="forbid ZeRO-3 / FSDP")
    p.add_argument("--no-recompute", action="store_true", help="forbid activation recomputation")
    p.add_argument("--max-memory-gib", type=finite_float(0, 1e6), help="memory cap per device")
    p.add_argument("--export", choices=target_names(),
                   help="also print the best plan as this framework's configuration")
    p.add_argument("--plan", help="also compare your plan with the best one: a plan file (or plan/estimate --json "
                                  "output), its JSON text, or fields such as tp=8,pp=2 (dp fills the devices; the "
                                  "search then uses its global batch, sequence length and dtype)")
    p.add_argument("--from-script", metavar="FILE",
                   help="also compare your own launch script / ds_config.json / torchtitan overrides with the best "
                        "plan (the search then uses the script's global batch, sequence length and dtype)")
    p.add_argument("--no-module-lists", action="store_true",
                   help="under megatron/mindspeed, do not try Megatron's --recompute-modules lists (layernorm, "
                        "core_attn, mlp, moe_act, ...) on the best plans that recompute (default: tried, kept where "
                        "they rank higher)")
    p.add_argument("--free-overlaps", action="store_true",
                   help="with --from-script: let the search choose the communication overlaps (tensor-parallel, "
                        "gradient reduce, parameter gather) instead of keeping the script's")
    add_script_flags(p)
    p.add_argument("--headroom", type=finite_float(0, 1, min_open=False, max_open=True), default=DEFAULT_HEADROOM,
                   help=f"fraction of usable memory kept free (default {DEFAULT_HEADROOM:g}: P(fit) carries the risk)")
    p.add_argument("--min-p-fit", type=finite_float(0, 1, min_open=False), default=DEFAULT_MIN_P_FIT,
                   help=f"discard a plan only when its P(fit) is below this (default {DEFAULT_MIN_P_FIT:g}); plans "
                        "between it and 1 are kept, ranked by step time / P(fit) and marked with their OOM risk")
    add_report_arg(p)
    add_trace_args(p)
    p.add_argument("--grad-knobs", default="default", metavar="LIST",
                   help="gradient communication knobs tried on the best plans: default (bf16 reduction where it "
                        "saves >= 1%%), lossy (also PowerSGD at --powersgd-rank), none, or a list such as "
                        "bf16,powersgd (docs/compression.md)")
    p.set_defaults(func=cmd_plan)



def _check_dualpipev_flags(args: argparse.Namespace) -> None:
    """DualPipeV's constraints on the flags the user fixed (:func:`partita.plan._validate_dualpipev`),
    said before the search: a structure that breaks them is never enumerated, so the search alone
    would explain the failure with an unrelated candidate's reason."""
    if args.pp is not None and args.pp < 2:
        raise PartitaError(f"--schedule dualpipev needs --pp >= 2 (two chunks per rank in a V over the pipeline), got {args.pp}")
    if args.vpp is not None and args.vpp != 2:
        raise PartitaError(f"--schedule dualpipev runs 2 chunks per rank: --vpp must be 2 or left out, got {args.vpp}")
    if args.pp and args.dp and args.global_batch // args.dp < 2 * args.pp:
        raise PartitaError(f"--schedule dualpipev needs at least 2*pp = {2 * args.pp} micro-batches; "
                           f"--global-batch {args.global_batch} over --dp {args.dp} gives at most "
                           f"{args.global_batch // args.dp}")

def search(args: argparse.Namespace, model, cluster):
    """The search the flags ask for; with --export, more ranked plans are kept (the best
    one the target can express is exported). Returns (result with the best max(--top, KNOB_POOL)
    plans, for the gradient-knob pass to re-rank and cut to --top; all ranked)."""
    from ..search.engine import search_plans
    from ..search.space import SearchSpace
    if args.global_batch is None or args.global_batch <= 0:
        raise PartitaError("--global-batch must be a positive number of sequences")
    dualpipev = getattr(args, "schedule", None) == "dualpipev"  # its two chunks per rank: vpp 2
    if dualpipev:
        _check_dualpipev_flags(args)
    space = SearchSpace(tp=args.tp, pp=args.pp, vpp=2 if dualpipev and not args.vpp else args.vpp, cp=args.cp,
                        ep=args.ep, etp=args.etp, dp=args.dp,
                        mbs=args.mbs,
                        zero=args.zero, recompute=args.recompute, dtype=args.dtype or "bf16",
                        allow_zero3=not args.no_zero3, allow_recompute=not args.no_recompute,
                        max_memory_gib=args.max_memory_gib, memory_headroom=args.headroom,
                        schedule=getattr(args, "schedule", None))
    space.options.update(carried_choices(args))  # the script's / flags' offload, moments, modules (search/space.py)
    space.module_lists = not getattr(args, "no_module_lists", False) and module_lists_apply(framework_arg(args), space.options)
    space.options.update(getattr(args, "script_overlaps", None) or {})  # the script's overlaps (space.script_overlaps)
    for name in ("finetune", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "sample_len"):  # every candidate fine-tunes so (issue 36)
        if getattr(args, name, None) is not None:
            space.options[name] = getattr(args, name)
    framework = framework_arg(args)
    if framework:
        from ..search.capabilities import restrict_space
        space.options["framework"] = framework  # every candidate is estimated as run by it
        restrict_space(space, framework)  # and is a plan it runs (search/capabilities.py)
    if args.vpp and args.vpp > 1 and args.pp == 1:
        raise PartitaError(f"--vpp {args.vpp} needs --pp > 1 (virtual stages interleave a pipeline)")
    if args.ep and not model.moe:
        raise PartitaError(f"--ep {args.ep} needs a mixture-of-experts model; {model.name} is dense")
    if args.etp and args.etp > 1 and not model.moe:
        raise PartitaError(f"--etp {args.etp} needs a mixture-of-experts model; {model.name} is dense (use --tp)")
    from ..search.comm_knobs import KNOB_POOL
    result = search_plans(model, cluster, args.global_batch, args.seq_len, space,
                          top=max(args.top, 200) if args.export else max(args.top, KNOB_POOL), min_p_fit=args.min_p_fit)
    ranked_all = result.plans
    result.plans = ranked_all[:max(args.top, KNOB_POOL)]  # the knob pass (comm_knob_lines) keeps --top of them
    return result, ranked_all


def carried_choices(args: argparse.Namespace) -> dict:
    """``{field: value}`` of the choices every candidate carries (:data:`partita.search.space.CARRIED_CHOICES`):
    the ``--optimizer-offload``, ``--moment-dtype`` and ``--recompute-modules`` flags, or, with
    ``--from-script`` / ``--plan``, your plan's values (:func:`your_plan` puts them in ``args``)."""
    from ..plan import flag_dest
    from ..search.space import CARRIED_CHOICES
    return {name: getattr(args, flag_dest(name)) for name in CARRIED_CHOICES
            if getattr(args, flag_dest(name), None) not in (None, "")}


def check_carried_flags(args: argparse.Namespace, model, world_size: int) -> None:
    """The carried-choice flags given (:func:`carried_choices`) with the fixed ``--recompute``,
    ``--no-recompute``, ``--zero`` and ``--framework``, checked by :func:`partita.plan.validate` on a
    plan that has them, so ``partita plan`` refuses them in ``partita estimate``'s words (e.g.
    ``--recompute-modules`` with ``--recompute full``: Megatron reads the modules only with selective
    recompute; ``--optimizer-offload`` with ``--zero 0`` under Megatron). One line, the first problem."""
    from ..plan import Plan, validate
    from ..search.space import CARRIED_CHOICES
    given = carried_choices(args)
    if not given:
        return
    recompute = "none" if args.no_recompute else args.recompute or ("selective" if "recompute_modules" in given
                                                                     else "none")
    fields = dict(given, dp=world_size, gbs=world_size, recompute=recompute,
                  zero=1 if args.zero is None else args.zero)
    framework = framework_arg(args)
    if framework:
        fields["framework"] = framework
    problems = [e for e in validate(Plan(**fields), model) if any(name in e for name in CARRIED_CHOICES)]
    if problems:
        raise PartitaError(problems[0] + (" (--no-recompute)" if args.no_recompute and "recompute" in problems[0]
                                          else ""))


def plan_time_notes(est) -> list[str]:
    """What the estimate of a proposed plan leaves untimed (the host optimizer step under
    optimizer offload, the module recompute), in :func:`partita.estimate.time_not_modelled`'s
    words - the notes ``partita estimate`` prints for the same plan."""
    from ..estimate import time_not_modelled
    return [note for _, note in time_not_modelled(est.plan)]


def _framework_hint(target: str) -> str:
    """The flag that searches only the plans an export target runs (search/capabilities.py), if any."""
    from ..search.capabilities import capabilities
    return f"; --framework {target} searches only plans {target} runs" if capabilities(target) else ""


def export_best(target: str, ranked_all: list, best, model, cluster=None):
    """The best ranked plan ``target`` can express: (exported, note or None when it is plan 1)."""
    from ..export import export
    refusals = []
    for rank, candidate in enumerate(ranked_all, 1):
        try:
            exported = export(target, candidate.plan, model, cluster)
        except PartitaError as e:
            refusals.append(f"plan {rank}: {e}")
            continue
        if rank == 1:
            return exported, None
        return exported, (f"{target} cannot express plan 1 ({refusals[0].split(': ', 1)[1]}); exported plan "
                          f"{rank}, {candidate.plan.summary()}, {candidate.step_time_s / best.step_time_s - 1:+.0%} "
                          "step time" + _framework_hint(target))
    raise PartitaError(f"none of the {len(ranked_all)} best plans can be expressed in {target}: "
                       + (refusals[0] if refusals else "no plan"))


def comm_knob_lines(args: argparse.Namespace, result) -> list[str]:
    """Try --grad-knobs on the search's best plans (search/comm_knobs.py); its why-not lines."""
    from ..search.capabilities import allowed_grad_knobs
    from ..search.comm_knobs import parse_grad_knobs, try_comm_knobs
    knobs, left_out = allowed_grad_knobs(framework_arg(args), parse_grad_knobs(args.grad_knobs))
    return try_comm_knobs(result, knobs, args.powersgd_rank, keep=args.top) + left_out


def module_list_lines(args: argparse.Namespace, result) -> list[str]:
    """Try Megatron's selective-recompute module lists on the search's best plans
    (search/recompute_modules.py) unless ``--no-module-lists``, the framework runs op-level selective
    recompute, or the user's (or script's) ``--recompute-modules`` is carried; its why-not line."""
    from ..search.comm_knobs import KNOB_POOL
    from ..search.recompute_modules import applies, try_module_lists
    if args.no_module_lists or getattr(args, "recompute", None) == "full" \
            or not applies(framework_arg(args), carried_choices(args)):
        return []
    return try_module_lists(result, KNOB_POOL)


#: The search's global batch when neither --global-batch nor your plan (--from-script / --plan) gives one.
DEFAULT_GLOBAL_BATCH = 2048


def cmd_plan(args: argparse.Namespace) -> int:
    if is_traced(args):  # --model module:factory or a traced spec (issue 19)
        args.global_batch = args.global_batch or DEFAULT_GLOBAL_BATCH
        return cmd_plan_traced(args)
    from .import_cmd import comparison
    from ..search.engine import infeasible_message
    from ..search.explain import why_not
    model, cluster = cluster_and_model(args)
    if args.report:
        from ..report import check_report_path
        check_report_path(args.report)
    check_carried_flags(args, model, cluster.world_size)
    yours = your_plan(args, model, cluster)
    args.global_batch = args.global_batch or DEFAULT_GLOBAL_BATCH
    result, ranked_all = search(args, model, cluster)
    tokens = parse_tokens(args.tokens) if args.tokens else None
    from .finetune_data import dataset_tokens
    tokens = dataset_tokens(args, args.seq_len, tokens)  # --seq-lengths: days for the dataset (issue 36)
    if not result.plans:
        raise PartitaError(infeasible_message(result))
    module_lines = module_list_lines(args, result)  # Megatron's --recompute-modules lists (search/recompute_modules.py)
    knob_lines = module_lines + comm_knob_lines(args, result)  # issue 17: re-ranked with --grad-knobs (default: bf16)
    reasons = why_not(result) + knob_lines
    # plan 1 as printed: the ranking after the knob re-ranking first, then the rest of the search's
    shown = {id(e) for e in result.plans}
    candidates = list(result.plans) + [e for e in ranked_all if id(e) not in shown]
    exported, export_note = export_best(args.export, candidates, result.best, model, cluster) if args.export else (None, None)
    if yours:
        yours.min_p_fit = args.min_p_fit  # your plan is judged as the search judges its own
    line = comparison(yours, result.best, result.limit) if yours else None
    if args.report:
        from .plan_report import write_plan_report
        write_plan_report(args, model, cluster, result, reasons, tokens, search)
    if args.json:
        out = plan_json(args, model, cluster, result, reasons, tokens, exported, export_note)
        if yours and args.from_script:
            out["from_script"] = dict(yours.to_dict(), file=args.from_script, comparison=line,
                                      not_modelled=list(args.not_modelled), reading_note=args.reading_note)
        elif yours:
            out["from_plan"] = dict(yours.to_dict(), given=args.plan, comparison=line)
        if args.seq_lengths:  # issue 36: plan 1's packing and days for the dataset
            from .finetune_data import dataset_report
            out["dataset"] = dataset_report(args, result.plans[0])
        print(json.dumps(out, indent=2))
        return 0
    from .render import print_plans
    print_plans(model, cluster, args.global_batch, args.seq_len, result, reasons, tokens,
                headroom=args.headroom, cap_gib=args.max_memory_gib)
    from .finetune_data import dataset_lines, dataset_report, finetune_lines
    for note in finetune_lines(result.plans[0]) + dataset_lines(dataset_report(args, result.plans[0])):  # issue 36: plan 1
        print("plan 1 " + note if note.startswith("dataset") else note)
    for note in plan_time_notes(result.plans[0]):  # as partita estimate says of the same plan
        print(f"plan 1, not modelled: {note}")
    if exported:
        if export_note:
            print(f"partita: warning: {export_note}", file=sys.stderr)
        from .render import make_console
        make_console().print(f"[bold]{'Plan 1' if not export_note else 'Best expressible plan'} as "
                             f"{exported.target} configuration[/bold]")
        print(exported.text, end="")
        for w in exported.warnings:
            print(f"partita: warning: {w}", file=sys.stderr)
    if line:
        print(line)
    for note in not_modelled_lines(args.not_modelled):
        print(note)
    if args.reading_note:
        print(f"note: {args.reading_note}")  # what reading the script assumed
    return 0


def your_plan(args: argparse.Namespace, model, cluster):
    """The estimate of the user's own plan (``--from-script`` or ``--plan``, one of them), or
    None; the search then runs at its batch, length and dtype."""
    from ..estimate import estimate
    from ..plan import check
    if args.from_script and args.plan is not None:
        raise PartitaError(f"--plan {args.plan} and --from-script {args.from_script} both give your plan; give one")
    args.not_modelled, args.reading_note, args.script_overlaps = (), "", {}
    if getattr(args, "free_overlaps", False) and not args.from_script:
        raise PartitaError("--free-overlaps frees the overlaps a --from-script file chose; give --from-script FILE")
    if args.from_script:
        from ..imports import load_config as load_script
        read = load_script(args.from_script, devices=cluster.world_size, model=model, seq_len=args.seq_len,
                           fill=fill_inputs(args), **script_inputs(args))
        plan, args.not_modelled, args.reading_note = read.plan, read.not_modelled, read.reading_note
        if framework_arg(args):
            plan = plan.with_(framework=framework_arg(args))  # "as run by" the framework named
        args.framework = plan.framework  # the search estimates every candidate as the file's framework runs it
        if not args.free_overlaps:  # every candidate keeps the script's overlaps (search/space.py OVERLAP_CHOICES)
            from ..search.space import script_overlaps
            args.script_overlaps = script_overlaps(plan)
    elif args.plan is not None:
        defaults = {"gbs": args.global_batch or DEFAULT_GLOBAL_BATCH, "seq_len": args.seq_len,
                    **({"dtype": args.dtype} if args.dtype else {})}
        plan = check(read_plan_arg(args.plan, cluster.world_size, defaults), model, cluster.world_size)
    else:
        return None
    plan = plan.with_(**carried_choices(args))  # a flag given beside your plan changes it, as --framework does
    args.global_batch, args.seq_len, args.dtype = plan.gbs, plan.seq_len, plan.dtype
    from ..plan import flag_dest
    from ..search.space import CARRIED_CHOICES
    for name in CARRIED_CHOICES:  # every candidate carries your plan's choices (search/space.py)
        setattr(args, flag_dest(name), getattr(plan, name))
    return estimate(model, cluster, plan)


def plan_json(args: argparse.Namespace, model, cluster, result, reasons: list[str], tokens: float | None,
              exported, export_note: str | None) -> dict:
    """The --json output of ``partita plan``."""
    def with_run(e) -> dict:
        out = dict(e.to_dict(), not_modelled=plan_time_notes(e))  # estimate --json's field, for each plan
        if not tokens:
            return out
        return dict(out, run_days=e.run_days(tokens), device_hours=e.run_days(tokens) * 24 * cluster.world_size)
    out = {"model": model.name, "hardware": cluster.device.name, "devices": cluster.world_size,
           "devices_per_node": cluster.devices_per_node, "global_batch": args.global_batch, "seq_len": args.seq_len,
           "search_time_s": result.search_time_s, "candidates_evaluated": result.candidates_evaluated,
           "candidates_pruned_by_memory": result.candidates_pruned,
           "candidates_bounded_by_time": result.candidates_bounded,
           "memory_limit_gib": result.memory_limit_gib,
           "framework": framework_arg(args) or "megatron",
           "plans": [with_run(e) for e in result.plans],
           "why_not": reasons}
    if exported:
        out["export"] = {"target": exported.target, "text": exported.text, "warnings": exported.warnings,
                         "note": export_note}
    return out
