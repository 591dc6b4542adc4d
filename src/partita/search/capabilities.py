"""What each training framework can run: the one table the framework-aware search reads
(issue 32 item 4).

``partita plan --framework T`` (and ``--from-script``, which implies the framework the file
is for) searches only the layouts and knobs T runs, so that ``--export T`` writes plan 1.
Each :class:`Capabilities` field names one thing a framework does or does not run, and
``sources`` cites, per field, the framework code or documentation that says so. The
exporters (:mod:`partita.export`) keep their own refusals, worded for a plan file given by
hand, and flag first, with this table's reason, a plan they can write but the framework does
not run as planned (DeepSpeed tp with pp, torchtitan ZeRO-1/2); tests/test_frameworks.py checks that every plan this table lets through exports to its
framework and passes that framework's own parser (tests/export_oracles).

The estimate-side differences of a framework (what it saves, recomputes, overlaps) are in
:mod:`partita.cost.frameworks`; this table only says which plans exist there. Without
``--framework`` nothing is restricted: the search is the cost model's reference search
(bench/golden_estimates.py pins it).

==========================  ==================================================================
field                       what the search leaves out when it is off / what it allows
==========================  ==================================================================
``zero``                    the ZeRO stages the framework has
``sharded_with_pp``         ZeRO-2/3 with pp > 1
``fsdp2_zero3``             ZeRO-3 is torch FSDP2 under Megatron's ``--use-torch-fsdp2`` asserts:
                            pp 1, ep 1, no fp16, untied embeddings
``vpp``                     an interleaved pipeline (vpp > 1)
``dualpipev``               the DualPipeV schedule (``schedule="dualpipev"``, cost/pipeline.py)
``dualpipev_cp`` /          DualPipeV with context parallelism / with expert tensor parallelism
``dualpipev_etp``           (etp > 1 with ep > 1)
``split``                   which layer splits the pipeline can be given: ``any`` (Megatron's
                            layout), ``even`` (no boundary list), ``ends`` (uniform middle,
                            lighter first/last stages: torchtitan), ``noop`` (MindSpeed-LLM:
                            every stage padded to the largest with ``--noop-layers``; a layer in
                            every stage)
``cp`` / ``ep`` / ``etp``   context, expert and expert-tensor parallelism
``sp``                      sequence parallel with tp (else tp runs without it)
``tp_with_pp``              tensor and pipeline parallelism together
``expert_mesh_from_fsdp``   ep must divide dp_shard * cp * tp (dp_shard = dp when sharded, else 1)
``recompute``               the recompute modes
``recompute_layers``        a per-stage count of fully recomputed layers
``dtypes``                  the training precisions
``grad_knobs``              the gradient-communication knobs of :mod:`.comm_knobs` it has
``first_dense_stage``       MindSpeed-LLM's first-k-dense-replace rules: ``first_k < layers // pp``
                            (layers counting noop padding) and no pipeline stage made only of the
                            dense first layers
==========================  ==================================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..plan import Plan
from ..spec.model import ModelSpec


@dataclass(frozen=True)
class Capabilities:
    """What one framework runs (module docstring); ``sources``: (field, where it is written)."""

    name: str
    zero: frozenset[int] = frozenset({0, 1, 2, 3})
    sharded_with_pp: bool = True
    fsdp2_zero3: bool = False
    vpp: bool = True
    dualpipev: bool = True
    dualpipev_cp: bool = True
    dualpipev_etp: bool = True
    split: str = "any"
    cp: bool = True
    ep: bool = True
    etp: bool = True
    sp: bool = True
    tp_with_pp: bool = True
    expert_mesh_from_fsdp: bool = False
    recompute: frozenset[str] = frozenset({"none", "selective", "full"})
    recompute_layers: bool = True
    dtypes: frozenset[str] = frozenset({"bf16", "fp16", "fp8", "fp32"})
    grad_knobs: frozenset[str] = frozenset({"bf16"})
    first_dense_stage: bool = False
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False)


_MEGATRON = Capabilities("megatron", sharded_with_pp=False, dualpipev=False, sources=(
    ("dualpipev", "Megatron-LM core_v0.16.1 pipeline schedules are 1F1B and interleaved 1F1B (--schedules-method "
     "dualpipev is MindSpeed's); export/megatron.py refuses it"),
    ("zero", "Megatron-LM core_v0.16.1: --use-distributed-optimizer (ZeRO-1); Megatron-FSDP "
     "--data-parallel-sharding-strategy optim_grads (ZeRO-2) / optim_grads_params (ZeRO-3), "
     "docs/user-guide/features/megatron_fsdp.md"),
    ("sharded_with_pp", "Megatron-FSDP is not run with pipeline parallelism (its docs and examples are pp 1; "
     "partita's exporter refuses it, export/megatron.py)"),
    ("vpp/split", "--pipeline-model-parallel-layout (arguments.py core_v0.16.1): any split, interleaved or not"),
    ("grad_knobs", "--grad-reduce-in-bf16 (megatron/core/distributed/distributed_data_parallel_config.py); "
     "no gradient compression option"),
))

_MINDSPEED = Capabilities("mindspeed", zero=frozenset({0, 1, 3}), sharded_with_pp=False, fsdp2_zero3=True,
                          dualpipev_cp=False, dualpipev_etp=False, split="noop",
                          dtypes=frozenset({"bf16", "fp16", "fp32"}), first_dense_stage=True, sources=(
    ("zero", "MindSpeed-LLM (github Ascend/MindSpeed-LLM c77308a, on Megatron core_v0.12.1): the distributed optimizer "
     "(ZeRO-1; --use-distributed-optimizer in all 101 examples/mcore scripts that shard) or torch FSDP2 "
     "(--use-torch-fsdp2, ZeRO-3: parameters sharded too); no ZeRO-2"),
    ("fsdp2_zero3/sharded_with_pp", "mindspeed_llm/core/layerwise_disaggregated_training/initialize.py and Megatron "
     "validate_args: --use-torch-fsdp2 is not supported with pipeline or expert parallelism, fp16, tied embeddings "
     "(so its only ZeRO-3 never runs with pp > 1)"),
    ("split", "Megatron core_v0.12.1 has no --pipeline-model-parallel-layout and --num-layer-list excludes virtual "
     "stages (features_manager/pipeline_parallel/num_layer_list.py); --noop-layers pads every stage to the largest "
     "(examples/mcore/deepseek3: --num-layers 64 --noop-layers 61,62,63); training/utils.py "
     "check_pipeline_config refuses a stage of noop layers only"),
    ("first_dense_stage", "transformer_block.py validate_args: 'When using first-k-dense-replace, it is not allowed for "
     "all layers within a pp stage to be dense layers' (first_k_dense_replace >= num_layers // pp is refused)"),
    ("dtypes", "Ascend 910B/910C have no fp8 matrix units"),
    ("dualpipev_cp", "Ascend/MindSpeed docs/features/dualpipev.md: DualPipeV is not supported with context "
     "parallelism"),
    ("dualpipev_etp", "Ascend/MindSpeed docs/features/megatron_moe/megatron-moe-fb-overlap.md: --moe-fb-overlap "
     "(the overlapped pairs DualPipeV runs) needs expert tensor parallel 1"),
))

_DEEPSPEED = Capabilities("deepspeed", sharded_with_pp=False, vpp=False, dualpipev=False, split="even", cp=False,
                          ep=False, etp=False,
                          sp=False, tp_with_pp=False, recompute=frozenset({"none", "full"}),
                          dtypes=frozenset({"bf16", "fp16", "fp32"}), sources=(
    ("sharded_with_pp", "deepspeed/runtime/pipe/engine.py: 'ZeRO-2 and ZeRO-3 are incompatible with pipeline "
     "parallelism'"),
    ("vpp/dualpipev", "deepspeed/runtime/pipe/schedule.py TrainSchedule: 1F1B, no interleaved schedule, no DualPipeV"),
    ("split", "PipelineModule(partition_method='uniform'|'parameters'|'type:...'): no explicit boundary list"),
    ("cp/ep/etp", "ring context parallelism and expert parallelism are not ds_config options (Ulysses is another "
     "algorithm; DeepSpeed-MoE experts live in model code, split by ep only)"),
    ("sp/tp_with_pp", "tensor parallelism is AutoTP training (deepspeed.ai/tutorials/autotp-training: tp + data "
     "parallel + ZeRO on Hugging Face models through DeepSpeedEngine; no sequence parallel, not a PipelineModule)"),
    ("recompute", "deepspeed.checkpointing.checkpoint wraps whole blocks (runtime/activation_checkpointing): no "
     "op-level selective policy"),
    ("grad_knobs", "communication_data_type (runtime/constants.py)"),
    ("dtypes", "ds_config has bf16 / fp16 sections, no fp8 GEMM switch"),
))

_TORCHTITAN = Capabilities("torchtitan", zero=frozenset({0, 3}), split="ends", etp=False, expert_mesh_from_fsdp=True,
                           recompute_layers=False, dtypes=frozenset({"bf16", "fp8", "fp32"}),
                           grad_knobs=frozenset(), sources=(
    ("zero", "torchtitan 0.3.0 shards with FSDP2 only (data_parallel_shard_degree, fsdp_reshard_after_forward "
     "'always' = ZeRO-3) or replicates (DDP / HSDP replicate degree); no ZeRO-1/2 optimizer"),
    ("split", "distributed/pipeline_parallel.py: pipeline_parallel_layers_per_stage with "
     "pipeline_parallel_first/last_stage_less_layers"),
    ("etp", "config/configs.py ParallelismConfig 0.3.0: no expert_tensor_parallel_degree"),
    ("expert_mesh_from_fsdp", "distributed/parallel_dims.py build_mesh: efsdp = dp_shard * cp * tp // ep"),
    ("recompute_layers", "distributed/activation_checkpoint.py 0.3.0: none | selective (op SAC) | full | "
     "memory_budget; the layer-wise selective_ac_option is gone"),
    ("dtypes", "TrainingConfig.mixed_precision_param: Literal['bfloat16', 'float32']; fp8 via the float8 converter"),
    ("grad_knobs", "TrainingConfig.mixed_precision_reduce accepts only 'float32'"),
))

#: The capabilities of each framework ``--framework`` names; None: not restricted (Partita's
#: own runtime and InternEvo are no export target, the search is the reference one).
CAPABILITIES: dict[str, Capabilities | None] = {
    "megatron": _MEGATRON, "mindspeed": _MINDSPEED, "deepspeed": _DEEPSPEED, "torchtitan": _TORCHTITAN,
    "torchtitan-eager": _TORCHTITAN, "torchtitan-eager-loss": _TORCHTITAN, "partita": None, "internevo": None,
    "mindformers": None,
}


def capabilities(framework: str | None) -> Capabilities | None:
    """The table's entry for ``framework`` (None: no framework named, or one not restricted)."""
    return CAPABILITIES.get(framework) if framework else None


def _split_problem(caps: Capabilities, plan: Plan, model: ModelSpec) -> str | None:
    chunks = plan.pp * plan.vpp
    if chunks == 1:
        return None
    split = plan.stage_layers(model.layers)
    uneven = len(set(split)) > 1
    if caps.split == "even" and uneven:
        return f"{model.layers} layers over {chunks} stages need an uneven split, which {caps.name} cannot give"
    if caps.split == "ends" and uneven:
        per = max(split[1:-1] or split)
        if any(n != per for n in split[1:-1]) or split[0] > per or split[-1] > per:
            return f"layer split {','.join(map(str, split))}: {caps.name} splits uneven layers only as lighter " \
                   "first/last stages"
    if caps.split == "noop" and min(split) < 1:
        return f"{caps.name} refuses a pipeline stage of noop layers only (an empty stage)"
    return None


def _first_dense_problem(plan: Plan, model: ModelSpec) -> str | None:
    """MindSpeed-LLM's first-k-dense-replace check and its intent (no stage of dense layers only)."""
    first = model.moe.first_dense_layers if model.moe else 0
    if not first or plan.pp == 1:
        return None
    split = plan.stage_layers(model.layers)
    layers = max(split) * len(split)  # counting the noop layers that pad every stage to the largest
    if first >= layers // plan.pp:
        return (f"first {first} dense layers >= {layers} layers // pp {plan.pp}: MindSpeed-LLM refuses a "
                "pipeline stage of dense layers only")
    if plan.vpp == 1 and split[0] <= first:  # pp stage 0 is its first chunk alone
        return f"the first stage holds only the {first} dense layers, which MindSpeed-LLM refuses"
    if model.moe.layer_freq > 1 and len(set(split)) > 1:
        return "MindSpeed-LLM's noop layers would shift which layers are MoE (--moe-layer-freq > 1)"
    return None


def layout_problem(caps: Capabilities, plan: Plan, model: ModelSpec) -> str | None:
    """Why ``caps`` cannot run the layout of ``plan`` (degrees, split, dtype), or None."""
    name = caps.name
    for bad, why in ((plan.schedule == "dualpipev" and not caps.dualpipev, "the DualPipeV schedule"),
                     (plan.schedule == "dualpipev" and plan.cp > 1 and not caps.dualpipev_cp,
                      "DualPipeV with context parallelism (cp > 1): use cp 1, or another schedule "
                      "(interleaved-1f1b with the same vpp 2, or 1f1b)"),
                     (plan.schedule == "dualpipev" and plan.etp > 1 and plan.ep > 1 and not caps.dualpipev_etp,
                      "DualPipeV with expert tensor parallelism (etp > 1): use etp 1, or another schedule "
                      "(interleaved-1f1b with the same vpp 2, or 1f1b)"),
                     (plan.vpp > 1 and not caps.vpp, "an interleaved pipeline (vpp > 1)"),
                     (plan.cp > 1 and not caps.cp, "context parallelism (cp > 1)"),
                     (plan.ep > 1 and not caps.ep, "expert parallelism (ep > 1)"),
                     (plan.etp > 1 and not caps.etp, "expert tensor parallelism (etp > 1)"),
                     (plan.tp > 1 and plan.pp > 1 and not caps.tp_with_pp, "tp and pp together"),
                     (plan.dtype not in caps.dtypes, f"dtype {plan.dtype}"),
                     (plan.recompute_layers > 0 and not caps.recompute_layers, "a per-stage recompute layer count")):
        if bad:
            return f"{name} cannot run {why}"
    problem = _split_problem(caps, plan, model)
    if problem is None and caps.first_dense_stage:
        problem = _first_dense_problem(plan, model)
    return problem


def setting_problem(caps: Capabilities, plan: Plan, model: ModelSpec) -> str | None:
    """Why ``caps`` cannot run the plan's memory-saving setting (ZeRO stage, recompute mode)
    on its layout, or None."""
    name, zero = caps.name, plan.zero
    if zero not in caps.zero:
        return f"{name} has no ZeRO-{zero}"
    if zero >= 2 and plan.pp > 1 and not caps.sharded_with_pp:
        return f"{name} cannot run ZeRO-{zero} with pp > 1"
    if zero == 3 and caps.fsdp2_zero3 and (plan.pp > 1 or plan.ep > 1 or plan.dtype == "fp16"
                                            or model.tied_embeddings):
        return f"{name} runs ZeRO-3 as torch FSDP2: pp 1, ep 1, no fp16, untied embeddings"
    if plan.recompute not in caps.recompute:
        return f"{name} has no {plan.recompute} recompute"
    if caps.expert_mesh_from_fsdp and plan.ep > 1:
        shard = plan.dp if zero else 1
        if (shard * plan.cp * plan.tp) % plan.ep:
            return f"{name} builds the expert mesh from dp_shard*cp*tp, which ep {plan.ep} does not divide"
    return None


def plan_problem(framework: str | None, plan: Plan, model: ModelSpec) -> str | None:
    """Why ``framework`` cannot run ``plan`` (layout, then setting), or None."""
    caps = capabilities(framework)
    if caps is None:
        return None
    return layout_problem(caps, plan, model) or setting_problem(caps, plan, model)


def ends_lighter_split(layers: int, chunks: int) -> tuple[int, ...] | None:
    """The torchtitan split (uniform middle stages, lighter first/last) closest to even:
    ``per = ceil(layers / chunks)`` in every stage, the surplus ``chunks * per - layers``
    taken from the last stage first (it also holds the output layer), then the first."""
    per = -(-layers // chunks)
    surplus = chunks * per - layers
    last = min(surplus, per)
    first = surplus - last
    if chunks < 2 or first > per or (chunks > 2 and per < 1):
        return None
    return (per - first,) + (per,) * (chunks - 2) + (per - last,)


def restrict_space(space, framework: str | None) -> None:
    """Set what the search space itself decides for ``framework`` (``space``: a
    :class:`.space.SearchSpace`): no partial recompute where the framework has no per-stage
    layer count. The layouts and settings are filtered by :mod:`.layouts`."""
    caps = capabilities(framework)
    if caps is not None and not caps.recompute_layers:
        space.partial_recompute = False


def allowed_grad_knobs(framework: str | None, knobs: tuple[str, ...]) -> tuple[tuple[str, ...], list[str]]:
    """(the knobs of ``knobs`` ``framework`` has, one line per knob left out)."""
    caps = capabilities(framework)
    if caps is None:
        return knobs, []
    kept = tuple(k for k in knobs if k in caps.grad_knobs)
    return kept, [f"{k}: not tried, {caps.name} has no option for it" for k in knobs if k not in kept]

