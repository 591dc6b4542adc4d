"""Megatron-LM / MindSpeed-LLM command lines read back into a :class:`~partita.plan.Plan`
(issue 14 item 2; moved out of ``export/`` by issue 32), as the framework runs them (issue 32
item 3): every flag that changes memory or time is either read into a plan field here or named
by :mod:`.megatron_features` as not modelled; the pipeline's layer split is
:mod:`.megatron_layout`, the model the command line defines :mod:`.megatron_model`.

Everything else in the command is ignored (``parse_known_args``). The flag spellings are the ones
the exporters in ``partita.export`` write, which tests/test_export.py checks against each
framework's own parser. argparse is the parser of the foreign format here, not a command of ours.

Facts from the frameworks (NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py
``validate_args``; Ascend/MindSpeed@028de58):

- ``--expert-tensor-parallel-size`` absent: Megatron sets it to the tensor-parallel size (``if
  args.expert_tensor_parallel_size is None: ... = args.tensor_model_parallel_size``), whatever ep
  is; Partita keeps etp 1 for a dense model (etp means nothing without experts);
- ``--sequence-parallel`` with tp 1 is switched off ("Disabling sequence parallelism because tensor
  model parallelism is disabled");
- ``--recompute-activations`` sets the granularity to selective; the old ``--checkpoint-activations``
  (removed: Megatron now exits on it) meant full recompute of every layer;
- ``--recompute-method block --recompute-num-layers N`` recomputes the first N layers of each
  chunk: N at least the largest chunk is every layer (Megatron accepts it); ``uniform`` recomputes
  every layer (N layers share one checkpoint);
- ``--grad-reduce-in-bf16``: the gradient buffer and its reduction in bf16 (Partita's grad_dtype);
- ``--fp8-param-gather`` (with ``--fp8-format``): the weights are fp8 only (plan ``fp8_param_gather``);
  MindSpeed's ``--reuse-fp32-param``: the fp32 master as bf16 weight + residual (``reuse_fp32_param``);
  cost/states.py derives both;
- ``--use-ascend-mc2`` (MindSpeed): tensor-parallel communication fused with the matmuls (Partita's
  tp_comm_overlap); ``--attention-backend unfused|local``: attention that keeps its probabilities,
  as MindSpeed's does without ``--use-flash-attn``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..errors import PartitaError
from ..plan import Plan
from ..spec.model import ModelSpec
from .megatron_deepspeed import VALUE_FLAGS, is_megatron_deepspeed, translate
from .megatron_features import unmodelled
from .megatron_layout import LayoutFlags, chunk_ranges, layout_split, split_of
from .megatron_model import ScriptModel, contradiction, model_from_megatron

#: ``--optimizer-cpu-offload``: its memory is the plan's ``optimizer_offload`` (cost/states.py), its time is not
#: modelled - still named, with what is left out.
OFFLOAD_TIME_NOTE = ("--optimizer-cpu-offload: the optimizer step on the host and its device-host copies take time "
                     "the estimate does not count (the states' memory is modelled)")

#: ``--recompute-modules`` Partita models: the memory (plan ``recompute_modules``, cost/activations.py) and the
#: recompute's time (the modules' forward, cost/compute.py ``module_recompute_forward``); not the fp8 casts.
MODULES_TIME_NOTE = ("--recompute-modules {}: the modules' memory is modelled and their recompute's time as their "
                     "forward again (not its fp8 casts)")

#: Adam's two moments in different dtypes: the plan has one moment dtype.
MOMENTS_NOTE = ("--exp-avg-dtype {} / --exp-avg-sq-dtype {}: moments in two dtypes, estimated in fp32 "
                "(more optimizer memory than the run)")

FSDP_STRATEGY_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}

#: Size flags of a Megatron/MindSpeed command line: each a whole number from 1 (a 0 divides by zero).
MEGATRON_SIZES = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                  "--expert-model-parallel-size", "--micro-batch-size", "--global-batch-size", "--seq-length",
                  "--num-layers", "--num-layers-per-virtual-pipeline-stage", "--virtual-pipeline-model-parallel-size",
                  "--num-virtual-stages-per-pipeline-rank", "--recompute-num-layers", "--num-experts",
                  "--expert-tensor-parallel-size")


def _megatron_parser() -> argparse.ArgumentParser:
    """The flags this module reads, at Megatron's defaults (``allow_abbrev`` off: a flag Megatron
    does not know must not be taken for a prefix of one it does)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, default in (("--tensor-model-parallel-size", 1), ("--pipeline-model-parallel-size", 1),
                          ("--context-parallel-size", 1), ("--expert-model-parallel-size", 1),
                          ("--micro-batch-size", 1), ("--global-batch-size", None), ("--seq-length", 2048),
                          ("--num-layers", None), ("--num-layers-per-virtual-pipeline-stage", None),
                          ("--num-virtual-stages-per-pipeline-rank", None),
                          ("--virtual-pipeline-model-parallel-size", None), ("--expert-tensor-parallel-size", None),
                          ("--decoder-first-pipeline-num-layers", None), ("--decoder-last-pipeline-num-layers", None),
                          ("--recompute-num-layers", None), ("--num-experts", None)):
        p.add_argument(flag, type=int, default=default)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--use-megatron-fsdp", "--use-torch-fsdp2",
                 "--bf16", "--fp16", "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--recompute-activations", "--checkpoint-activations", "--grad-reduce-in-bf16", "--use-ascend-mc2",
                 "--use-flash-attn", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split", "--fp8-param-gather", "--reuse-fp32-param",
                 "--optimizer-cpu-offload"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--optimizer-offload-fraction", type=float, default=1.0)  # arguments.py: default 1.0
    p.add_argument("--recompute-modules", nargs="*", default=None)  # arguments.py: nargs="*"
    p.add_argument("--use-precision-aware-optimizer", action="store_true")
    for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):  # arguments.py: fp32 by default
        p.add_argument(flag, default="fp32", choices=("fp32", "fp16", "bf16", "fp8"))
    for flag in ("--pipeline-model-parallel-layout", "--recompute-granularity", "--recompute-method", "--fp8-format",
                 "--num-layer-list", "--noop-layers", "--schedules-method", "--attention-backend"):
        p.add_argument(flag, default=None)
    p.add_argument("--data-parallel-sharding-strategy", default="no_shard")
    # fine-tuning (MindSpeed-LLM mindspeed_llm/features_manager/finetune/lora.py: --lora-r 16, --lora-alpha 32
    # by default; LoRA is on when --lora-target-modules lists modules, tasks/posttrain/lora/utils.py)
    p.add_argument("--lora-target-modules", nargs="+", default=None)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--finetune", action="store_true")
    p.add_argument("--is-instruction-dataset", action="store_true")
    p.add_argument("--stage", default=None)
    return p


def _finetune(ns: argparse.Namespace) -> tuple[dict, str]:
    """(the plan's fine-tuning fields, a note on LoRA targets read as a wider group or "") of the
    command line: LoRA where ``--lora-target-modules`` lists modules (rank ``--lora-r``, alpha
    ``--lora-alpha``), full fine-tuning with ``--stage sft`` / ``--is-instruction-dataset`` (``--finetune``
    alone is Megatron's "load the checkpoint without its optimizer": a pre-training run's memory), else
    pre-training (no field set)."""
    if ns.lora_target_modules:
        from .finetune import lora_targets
        targets, note = lora_targets(ns.lora_target_modules, "--lora-target-modules")
        return {"finetune": "lora", "lora_rank": ns.lora_r, "lora_alpha": ns.lora_alpha, "lora_targets": targets}, note
    if ns.stage == "sft" or ns.is_instruction_dataset:  # --finetune alone: Megatron's "load without optimizer"
        return {"finetune": "full"}, ""
    return {}, ""


def _int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    """A comma-separated list of whole numbers (``--num-layer-list``, ``--noop-layers``)."""
    if text is None:
        return None
    items = [x.strip() for x in text.strip("\"'").split(",") if x.strip()]
    if not items or not all(x.isdigit() for x in items):
        raise PartitaError(f"{flag} {text!r} must be comma-separated whole numbers")
    return tuple(int(x) for x in items)


def _vpp(ns: argparse.Namespace, num_layers: int | None, pp: int) -> int:
    """Virtual stages per rank from the flag that gives them (arguments.py: layers per rank over
    ``--num-layers-per-virtual-pipeline-stage``, or the count itself)."""
    if ns.num_layers_per_virtual_pipeline_stage:
        if not num_layers:
            raise PartitaError("--num-layers-per-virtual-pipeline-stage needs --num-layers (or --model) to give vpp")
        per_rank = (num_layers + ns.account_for_embedding_in_pipeline_split
                    + ns.account_for_loss_in_pipeline_split) // pp
        if per_rank % ns.num_layers_per_virtual_pipeline_stage:
            raise PartitaError(f"{per_rank} layers per pipeline rank are not a multiple of "
                               f"--num-layers-per-virtual-pipeline-stage {ns.num_layers_per_virtual_pipeline_stage}")
        return max(1, per_rank // ns.num_layers_per_virtual_pipeline_stage)
    return ns.num_virtual_stages_per_pipeline_rank or ns.virtual_pipeline_model_parallel_size or 1


def _layout(ns: argparse.Namespace, num_layers: int | None, pp: int) -> tuple[int, tuple[int, ...] | None, int]:
    """(vpp, layer_split, the largest chunk counting noop layers) of the layout flags."""
    if ns.pipeline_model_parallel_layout:
        split, vpp = layout_split(ns.pipeline_model_parallel_layout, pp, ns.num_layers)
        return vpp, split, max(split)
    dualpipev = ns.schedules_method == "dualpipev"
    flags = LayoutFlags(num_layers, pp, 1 if dualpipev else _vpp(ns, num_layers, pp),
                        ns.decoder_first_pipeline_num_layers, ns.decoder_last_pipeline_num_layers,
                        ns.account_for_embedding_in_pipeline_split, ns.account_for_loss_in_pipeline_split,
                        _int_list("--num-layer-list", ns.num_layer_list),
                        frozenset(_int_list("--noop-layers", ns.noop_layers) or ()), dualpipev)
    vpp = 2 if dualpipev else flags.vpp  # DualPipeV: two chunks per rank
    if not num_layers:
        return vpp, None, 0
    largest = max(len(r) for r in chunk_ranges(flags))
    return vpp, split_of(flags), largest


def _recompute(ns: argparse.Namespace, largest_chunk: int) -> tuple[str, int]:
    """(recompute, recompute_layers) as Megatron runs the recompute flags (module docstring)."""
    granularity = ns.recompute_granularity
    if ns.recompute_activations:
        granularity = "selective"
    elif ns.checkpoint_activations and not granularity:
        granularity = "full"
    if granularity != "full" or ns.recompute_method != "block" or not ns.recompute_num_layers:
        return granularity or "none", 0
    every = largest_chunk and ns.recompute_num_layers >= largest_chunk
    return "full", 0 if every else ns.recompute_num_layers


def _modules(ns: argparse.Namespace, recompute: str) -> str:
    """``recompute_modules`` of the plan: Megatron's ``--recompute-modules`` with selective recompute
    when Partita models every module named (:data:`partita.plan.RECOMPUTE_MODULES`), else "" (the
    plan's op-level selective; the flag stays named).

    Selective recompute without ``--recompute-modules`` (``--recompute-activations``, which sets the
    granularity to selective, or a bare ``--recompute-granularity selective``) runs Megatron-Core's
    default module list, ``["core_attn"]`` (megatron/core/transformer/transformer_config.py,
    ``__post_init__``: ``if self.recompute_granularity == "selective" and self.recompute_modules is
    None``; the same at core_v0.12.1, the core MindSpeed-LLM runs, l.724), so it is read as
    "core_attn", not as Partita's op-level selective (which keeps about half as much)."""
    from ..plan import RECOMPUTE_MODULES
    mods = [m for word in (ns.recompute_modules or ()) for m in word.split(",") if m]
    if recompute == "selective" and ns.recompute_modules is None:
        return "core_attn"
    if recompute != "selective" or not mods or not set(mods) <= set(RECOMPUTE_MODULES):
        return ""
    return ",".join(dict.fromkeys(mods))


def _moment_dtype(ns: argparse.Namespace) -> str:
    """``moment_dtype``: Adam's moments' storage dtype under ``--use-precision-aware-optimizer`` when
    ``--exp-avg-dtype`` and ``--exp-avg-sq-dtype`` agree (else fp32, and :data:`MOMENTS_NOTE` says so)."""
    if ns.use_precision_aware_optimizer and ns.exp_avg_dtype == ns.exp_avg_sq_dtype:
        return ns.exp_avg_dtype
    return "fp32"


def _zero(ns: argparse.Namespace) -> int:
    """ZeRO stage: Megatron-FSDP's sharding strategy, torch FSDP2 (3), the distributed optimizer (1)."""
    if ns.use_megatron_fsdp:
        return FSDP_STRATEGY_ZERO.get(ns.data_parallel_sharding_strategy, 0)
    return 3 if ns.use_torch_fsdp2 else 1 if ns.use_distributed_optimizer else 0


def _plan(ns: argparse.Namespace, world_size: int, num_layers: int | None, moe: bool, framework: str) -> Plan:
    """The plan of parsed flags; ``num_layers`` counts MindSpeed's noop layers."""
    tp, pp, cp = ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.context_parallel_size
    if world_size % (tp * pp * cp):
        raise PartitaError(f"world size {world_size} is not a multiple of tp*pp*cp = {tp * pp * cp}")
    vpp, split, largest = _layout(ns, num_layers, pp)
    recompute, rc_layers = _recompute(ns, largest)
    dp = world_size // (tp * pp * cp)
    unfused = ns.attention_backend in ("unfused", "local") or (framework == "mindspeed" and not ns.use_flash_attn)
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ns.expert_model_parallel_size,
                etp=ns.expert_tensor_parallel_size or (tp if moe else 1), sp=ns.sequence_parallel and tp > 1,
                zero=_zero(ns), mbs=ns.micro_batch_size, gbs=ns.global_batch_size or ns.micro_batch_size * dp,
                seq_len=ns.seq_length, recompute=recompute, recompute_layers=rc_layers,
                dtype="fp8" if ns.fp8_format else "bf16" if ns.bf16 else "fp16" if ns.fp16 else "fp32",
                grad_dtype="bf16" if ns.grad_reduce_in_bf16 else "fp32",
                schedule=("dualpipev" if ns.schedules_method == "dualpipev"
                          else "interleaved-1f1b" if vpp > 1 else "1f1b"),
                layer_split=split,
                tp_comm_overlap=ns.tp_comm_overlap or ns.use_ascend_mc2, overlap_grad_reduce=ns.overlap_grad_reduce,
                overlap_param_gather=ns.overlap_param_gather, attention="unfused" if unfused else "fused",
                fp8_param_gather=ns.fp8_param_gather and bool(ns.fp8_format), reuse_fp32_param=ns.reuse_fp32_param,
                optimizer_offload=ns.optimizer_offload_fraction if ns.optimizer_cpu_offload else 0.0,
                recompute_modules=_modules(ns, recompute),
                moment_dtype=_moment_dtype(ns))


@dataclass(frozen=True)
class MegatronRead:
    """What a command line says: the plan, the model it defines (None when it defines none,
    or one Partita cannot build: ``model_note`` says why, e.g. only the tokenizer knows the
    vocabulary), and the flags that change cost but that Partita does not model
    (``"--flag value: what it changes"``)."""

    plan: Plan
    model: ModelSpec | None
    not_modelled: tuple[str, ...]
    model_note: str = ""


def read_megatron(argv: list[str], world_size: int, model: ModelSpec | None = None, framework: str = "megatron",
                  name: str = "script") -> MegatronRead:
    """The plan, model and unmodelled flags of a Megatron-LM / MindSpeed-LLM command line on
    ``world_size`` ranks; ``model`` (``--model``) gives the layer count where the script has none.
    A Megatron-DeepSpeed command line is read in its own spellings (:mod:`.megatron_deepspeed`)."""
    fork = is_megatron_deepspeed(argv)
    argv, ds_fields, ds_notes = translate(argv) if fork else (argv, {}, ())
    ns, _ = _megatron_parser().parse_known_args(argv)
    try:  # the plan is read even where the script's model is not (the note says why)
        script = model_from_megatron(argv, name)
    except PartitaError as e:
        script = ScriptModel(None, str(e))
    noop = len(_int_list("--noop-layers", ns.noop_layers) or ())
    num_layers = ns.num_layers or (model.layers + noop if model else None)
    moe = bool(ns.num_experts) or bool(model and model.moe)
    fields, lora_note = _finetune(ns)
    plan = _plan(ns, world_size, num_layers, moe, framework).with_(**fields)
    if fork:  # DeepSpeed's ZeRO, not Megatron's distributed optimizer; ZB-H1
        plan = plan.with_(**ds_fields)
    skip = ("--context-parallel-algo",) if plan.cp == 1 else ()
    notes = tuple(OFFLOAD_TIME_NOTE if n.startswith("--optimizer-cpu-offload")
                  else MODULES_TIME_NOTE.format(plan.recompute_modules.replace(",", " "))
                  if n.startswith("--recompute-modules") and plan.recompute_modules else n
                  for n in unmodelled(argv) if n.split(" ", 1)[0].rstrip(":") not in skip)
    if ns.use_precision_aware_optimizer and ns.exp_avg_dtype != ns.exp_avg_sq_dtype:
        notes += (MOMENTS_NOTE.format(ns.exp_avg_dtype, ns.exp_avg_sq_dtype),)
    notes += ds_notes
    return MegatronRead(plan, script.spec, notes + ((lora_note,) if lora_note else ()), script.missing_vocab)


def resolve_model(argv: list[str], given: ModelSpec | None, path: str) -> tuple[ModelSpec | None, str]:
    """(the model to estimate with, why the command line gives none): ``--model`` (``given``) if
    it agrees with the model the command line defines (else one line naming both values), else
    the command line's own model."""
    if is_megatron_deepspeed(argv):
        argv = translate(argv)[0]
    try:
        script = model_from_megatron(argv, path.rsplit("/", 1)[-1])
    except PartitaError as e:
        script = ScriptModel(None, str(e))
    if given is not None and script.spec is not None:
        line = contradiction(given, script.spec, path)
        if line:
            raise PartitaError(line)
    return (given or script.spec), ("" if given or script.spec else script.missing_vocab)


def plan_from_megatron(argv: list[str], world_size: int, layers: int | None = None) -> Plan:
    """The plan a Megatron-LM / MindSpeed-LLM ``pretrain_gpt.py`` command line runs on ``world_size``
    ranks (``layers``: the model's, where the command line has no ``--num-layers``)."""
    argv, fields = translate(argv)[:2] if is_megatron_deepspeed(argv) else (argv, {})
    ns, _ = _megatron_parser().parse_known_args(argv)
    noop = len(_int_list("--noop-layers", ns.noop_layers) or ())
    plan = _plan(ns, world_size, ns.num_layers or (layers + noop if layers else None), bool(ns.num_experts),
                 "megatron").with_(**_finetune(ns)[0])
    return plan.with_(**fields)


def switch_flags() -> set[str]:
    """The flags of :func:`known_flags` that take no value (``store_true``): a word after one is not its value."""
    return {s for action in _megatron_parser()._actions if action.nargs == 0 for s in action.option_strings}


def known_flags() -> set[str]:
    """Every flag :func:`plan_from_megatron` reads (a value it cannot know is named, not guessed),
    Megatron-DeepSpeed's own spellings among them."""
    return {s for action in _megatron_parser()._actions for s in action.option_strings} | set(VALUE_FLAGS)
