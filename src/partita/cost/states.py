"""Per-rank model states: weights, gradients and optimizer states, and the parameters a
pipeline rank holds.

Model states (Rajbhandari et al. 2020, ZeRO sec. 3; Megatron-LM distributed optimizer),
bytes per parameter with mixed precision and Adam:

==========  =========================  ======================================
component   bytes                      sharded over the data-parallel group at
==========  =========================  ======================================
weights     2 (bf16/fp16; fp32: 4)     zero 3
gradients   4 (fp32 main grads) or 2   zero 2 and 3 (unless accumulated unsharded)
optimizer   12 (fp32 master + m + v);  zero 1, 2 and 3
            fp32 training: 8 (m + v)
==========  =========================  ======================================

MindSpore/MindFormers keeps no fp32 master: its 16-bit parameters are the optimizer's copy
(:attr:`.frameworks.Framework.master_in_params`): 2 + grads + 8 (m, v in fp32).
fp8 training keeps bf16 weights and an fp8 copy of each (1 byte, :func:`fp8_weight_cache`);
with Megatron's ``--fp8-param-gather`` the fp8 weight is the only one, and MindSpeed's
``--reuse-fp32-param`` stores the fp32 master as the bf16 weight plus a 16-bit residual
(:func:`_weight_storage` has both derivations).
Dense weights are sharded over dp x cp ranks; routed-expert weights over the expert
data-parallel group ``edp = dp*cp*tp/(ep*etp)``. A rank holds ``E / ep`` routed experts,
each ``1 / etp`` of it (Megatron-Core expert tensor parallel: w1/w3 split by columns, w2
by rows), so its expert parameters are ``E p_e / (ep*etp)``; the ``ep*etp*edp = tp*cp*dp``
ranks of a stage hold every expert shard ``edp`` times [MoE parallel folding, Liu et al.
2025, arXiv:2504.14960, sec. 3].
"""
from __future__ import annotations

from ..plan import Plan
from ..spec.model import ModelSpec
from .compute import FP32_BYTES
from .frameworks import FRAMEWORKS
from .memo import memoised
from .placement import RankShape
from .shape import ParamShape, param_shape


def grad_bytes(dtype: str, grad_dtype: str) -> int:
    """Bytes per main-gradient element: fp32 unless both training and gradients are 16-bit."""
    return FP32_BYTES if grad_dtype == "fp32" or dtype == "fp32" else 2


def _grad_bytes(plan: Plan) -> int:
    return grad_bytes(plan.dtype, plan.grad_dtype)


def state_shard(plan: Plan) -> int:
    """Ranks one copy of the sharded model states is spread over (ZeRO / FSDP): the
    data-parallel x context-parallel group, or with HSDP (``0 < dp_shard < dp``) only the
    ``dp_shard x cp`` ranks of one shard group - each of the ``dp / dp_shard`` groups
    holds a full copy [FSDP2 on a 2-D (replicate, shard) mesh; Zhao et al. 2023, PyTorch
    FSDP, sec. 3.2.2 "hybrid sharding"; torchtitan ``dp_shard`` x ``dp_replicate``]."""
    shard = plan.dp_shard if 0 < plan.dp_shard < plan.dp else plan.dp
    return shard * plan.cp


def expert_state_shard(plan: Plan) -> int:
    """Ranks one copy of a rank's routed-expert shard's states is spread over: the expert
    data-parallel group ``shard x tp / (ep*etp)`` - the ranks holding the same experts and
    the same etp slice of them (Megatron-Core's expert data parallel, ``edp = world /
    (etp*ep*pp)``, megatron/core/parallel_state.py; torchtitan's ``efsdp = dp_shard * cp *
    tp / ep``). With etp = 1 the group of the layout before expert tensor parallel."""
    return max(1, state_shard(plan) * plan.tp // (plan.ep * plan.etp))


def model_state_bytes(plan: Plan, params: float, shard: int) -> dict[str, float]:
    """Weights, gradients and optimizer bytes for ``params`` parameters sharded ``shard`` ways.

    zero 0-2 (Megatron-style): bf16 working weights (2), main gradients (4 fp32, or 2),
    fp32 master + Adam m, v (12), the last sharded from zero 1 and the gradients from
    zero 2. zero 3 (FSDP2 mixed precision / ZeRO-3): the sharded fp32 parameter *is* the
    master copy, so 4 (weights) + 4 (fp32 gradients, or 2) + 8 (m, v), all sharded; the
    bf16 copy exists only for gathered layers (counted in ``zero3 gathered layers``).
    fp8 (Transformer Engine style) caches an fp8 copy of each weight (1 byte) across
    micro-batches; the transpose is made per GEMM. Frameworks that cast per GEMM keep no
    copy (:func:`fp8_weight_cache`).
    """
    weights, grads, optimizer = _state_bytes(plan.dtype, _grad_bytes(plan), plan.zero, params, shard,
                                             full_gradients(plan), _autocast(plan), fp8_weight_cache(plan),
                                             plan.fp8_param_gather, plan.reuse_fp32_param,
                                             FRAMEWORKS[plan.framework].master_in_params)
    return {"weights": weights, "gradients": grads,
            "optimizer": device_optimizer_bytes(plan, plan.zero, optimizer, ((params, shard),))}


def device_optimizer_bytes(plan: Plan, zero: int, optimizer: float,
                           groups: tuple[tuple[float, int], ...]) -> float:
    """Optimizer bytes in device memory: ``optimizer`` (:func:`_state_bytes`' fp32 master + Adam m, v of
    the ``groups``' (params, shard) at ZeRO ``zero``) less what Megatron's precision-aware optimizer
    stores narrower (:func:`moment_saving` of :func:`stored_moment_dtype`, :func:`param_remainder_saving`),
    times the device share (:func:`device_optimizer_share`). The one place the full model, the rank
    states (cost/memory.py) and LoRA's adapters (cost/finetune.py) apply those rules."""
    moments = stored_moment_dtype(plan)
    for params, shard in groups:
        optimizer -= moment_saving(moments, zero, params, shard) + param_remainder_saving(plan, zero, params, shard)
    return optimizer * device_optimizer_share(plan)


def param_remainder_saving(plan: Plan, zero: int, params: float, shard: int) -> float:
    """Optimizer bytes saved when Transformer Engine's FusedAdam keeps only the 16 low bits of the fp32
    master weight (the high 16 are the bf16 parameter): ``2 x params / shard``, so the master costs 2
    bytes, as MindSpeed's ``--reuse-fp32-param`` (:func:`_weight_storage`, not counted twice).

    Megatron-Core (NVIDIA/Megatron-LM@HEAD): ``OptimizerConfig.store_param_remainders`` defaults True
    (megatron/core/optimizer/optimizer_config.py, no command-line flag turns it off); with
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` and ``bf16`` the distributed optimizer allocates
    ``tensors["master_param"] = init_shard(torch.int16)`` (megatron/core/optimizer/distrib_optimizer.py)
    and passes ``store_param_remainders`` to TE's FusedAdam (megatron/core/optimizer/__init__.py, TE >=
    2.1). Priced when: framework megatron (core_v0.12.1, MindSpeed-LLM's core, has no remainders), the
    plan's ``moment_dtype`` is not fp32 (the plan's only sign of ``--use-precision-aware-optimizer``),
    bf16 (an fp8 recipe other than delayed scaling leaves the master to Megatron-Core in fp32), no
    ``--optimizer-cpu-offload`` (HybridDeviceOptimizer is built without the precision-aware kwargs:
    :func:`stored_moment_dtype`), zero 1-2 (the distributed optimizer). Known gap: a precision-aware
    run with fp32 moments (plan ``moment_dtype`` fp32) and fp8 delayed-scaling runs are priced with a
    4-byte master."""
    if (plan.framework != "megatron" or stored_moment_dtype(plan) == "fp32" or plan.dtype != "bf16"
            or plan.reuse_fp32_param or zero >= 3 or zero < 1):
        return 0.0
    return 2 * params / shard


#: bytes of one Adam moment per parameter in each ``plan.moment_dtype`` (fp8: Megatron's uint8 storage)
MOMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def moment_saving(moment_dtype: str, zero: int, params: float, shard: int) -> float:
    """Optimizer bytes that Adam's two moments stored in ``moment_dtype`` (the plan's) save against fp32:
    ``2 x (4 - bytes) x params / shard`` (zero 1-2: the distributed optimizer's shard).

    Megatron's ``--use-precision-aware-optimizer`` hands the distributed optimizer's states to
    Transformer Engine's FusedAdam, which stores ``exp_avg`` / ``exp_avg_sq`` in ``--exp-avg-dtype`` /
    ``--exp-avg-sq-dtype`` ("used for storing the optimizer state in memory during training but does
    not affect the precision in the kernel computation", NVIDIA/Megatron-LM@d98e8a6
    megatron/training/arguments.py; choices fp32, fp16, bf16, fp8); the fp32 master weight stays
    (``--main-params-dtype`` fp32). Only below ZeRO-3 (Megatron's distributed optimizer)."""
    if moment_dtype == "fp32" or zero >= 3 or zero < 1:
        return 0.0
    return 2 * (4 - MOMENT_BYTES[moment_dtype]) * params / shard


def stored_moment_dtype(plan: Plan) -> str:
    """The dtype Adam's moments are really stored in: ``plan.moment_dtype``, except under
    ``--optimizer-cpu-offload`` (any ``plan.optimizer_offload`` > 0), where Megatron-Core builds
    ``HybridDeviceOptimizer`` with TE's ``Adam`` / ``CPUAdam`` and never passes ``exp_avg_dtype`` /
    ``exp_avg_sq_dtype`` (those reach only the non-offloaded branch: NVIDIA/Megatron-LM@d98e8a6
    megatron/core/optimizer/__init__.py, ``if config.optimizer_cpu_offload:`` before
    ``if config.use_precision_aware_optimizer:``), so the device-side share keeps fp32 moments."""
    return "fp32" if plan.optimizer_offload > 0 else plan.moment_dtype


def device_optimizer_share(plan: Plan) -> float:
    """The share of the optimizer states (fp32 master weight, Adam m and v) that stays in device
    memory: ``1 - plan.optimizer_offload``.

    Megatron-Core's ``--optimizer-cpu-offload`` runs the distributed optimizer's shard through
    ``HybridDeviceOptimizer`` (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py): the
    ``--optimizer-offload-fraction`` (default 1.0, "Ratio of optimizer state to offload to CPU",
    megatron/training/arguments.py) of the parameters get a CPU optimizer whose fp32 copies and
    moments live in pinned host memory, the gradients copied to the host (``pin_cpu_grads``); the
    device keeps the working weights and the main-gradient buffer (both counted as before). Known
    gap: the host step and the D2H/H2D copies take time that the step model does not count."""
    return 1.0 - plan.optimizer_offload


def full_gradients(plan: Plan) -> bool:
    """Whether a ZeRO-2/3 rank holds the whole (unsharded) gradient: with
    ``grad_accum_mode="unsharded"`` and more than one micro-batch the gradients accumulate
    unreduced until the last micro-batch (FSDP2 ``set_requires_gradient_sync(False)``
    on the others; DeepSpeed ZeRO-2 without ``reduce_scatter`` per micro-batch), so the
    full gradient is held; the default ``sharded`` mode reduce-scatters every micro-batch
    into the shard (plan.py, ``grad_accum_mode``)."""
    return plan.grad_accum_mode == "unsharded" and plan.grad_accum > 1


def _autocast(plan: Plan) -> bool:
    """Whether the plan's framework trains zero 0 under autocast over fp32 parameters
    (:attr:`.frameworks.Framework.zero0_autocast`)."""
    return plan.zero == 0 and FRAMEWORKS[plan.framework].zero0_autocast


#: Frameworks whose fp8 training keeps an fp8 copy of every weight between micro-batches
#: (:func:`fp8_weight_cache`).
FP8_WEIGHT_CACHE = frozenset({"megatron", "mindspeed", "deepspeed"})


def fp8_weight_cache(plan: Plan) -> bool:
    """Whether an fp8 plan keeps a 1-byte fp8 copy of each weight in memory.

    Transformer Engine (Megatron-LM, MindSpeed's fp8 path, Megatron-DeepSpeed) casts each
    weight to fp8 on the first micro-batch and reuses the cached copy on the others
    (``is_first_microbatch``, transformer_engine/pytorch/module/linear.py; ``fp8_model_params``
    off): 1 byte per parameter held. torchao's ``Float8Linear`` (torchtitan's float8 / mxfp8
    converters, and partita's runtime) scales and casts the weight inside every forward and
    backward GEMM (torchao/float8/float8_linear.py; with FSDP2 float8 all-gather the cast
    shard is the all-gather input, freed with it), so nothing persists. The published
    torchtitan pairs agree: the same run in bf16 and with float8 linears peaks within
    0.5 GiB (47.65 / 47.77 / 47.79 GiB on H100, 39.09 / 39.07 / 39.32 on MI300X, 33.71 /
    33.38 / 33.88 on B200, 28.07 / 28.07 under full AC: published_runs.csv, torchao rows),
    where a cached copy of Llama-3-8B sharded 8 ways would add 0.93 GiB."""
    return plan.framework in FP8_WEIGHT_CACHE


def _state_bytes(dtype: str, grad_b: int, z: int, params: float, shard: int,
                 full_grads: bool = False, autocast: bool = False,
                 fp8_cache: bool = True, fp8_params: bool = False,
                 reuse_fp32: bool = False, master_in_params: bool = False) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes of :func:`model_state_bytes` (the search's hot
    path); ``full_grads``: the gradients are held unsharded (:func:`full_gradients`);
    ``autocast`` (zero 0 only): fp32 parameters cast per op by torch.autocast, so fp32
    weights (4), fp32 gradients (4, the parameters' own ``.grad``) and AdamW m, v (8).
    ``master_in_params`` (MindSpore, :attr:`.frameworks.Framework.master_in_params`): a
    16-bit run's parameters are the master copy, so 2 (weights, sharded only at zero 3) and
    8 (AdamW m, v in fp32) - 4 bytes per parameter less than the 12-byte optimizer."""
    if autocast and z == 0:
        return params * 4, params * 4, params * 8
    if master_in_params and dtype in ("bf16", "fp16"):
        weight_b, opt_b = 2, 8
    elif dtype == "fp32" or z >= 3:
        weight_b, opt_b = 4, 8
    else:
        weight_b, opt_b = 2, 12
    weights = params * weight_b / (shard if z >= 3 else 1)
    if z == 2 and dtype == "fp32":
        # FSDP2 zero 2 (reshard_after_forward=False) keeps the gathered fp32 parameters
        # from forward to backward besides the fp32 shard the optimizer updates;
        # DeepSpeed ZeRO-2 likewise keeps the full fp32 parameters and an fp32 copy of its
        # partition (``single_partition_of_fp32_groups``). (16-bit: that shard is the
        # master copy already counted in the 12 optimizer bytes.)
        weights += params * 4 / shard
    if dtype == "fp8" and fp8_cache:
        weights += params * 1 / (shard if z >= 3 else 1)
    if (fp8_params or reuse_fp32) and z < 3:
        weights, opt_b = _weight_storage(dtype, params, weights, opt_b, fp8_params, reuse_fp32)
    grads = params * grad_b / (shard if z >= 2 and not full_grads else 1)
    optimizer = params * opt_b / (shard if z >= 1 else 1)
    return weights, grads, optimizer


def _weight_storage(dtype: str, params: float, weights: float, opt_b: int, fp8_params: bool,
                    reuse_fp32: bool) -> tuple[float, int]:
    """(weight bytes, optimizer bytes per parameter) below ZeRO-3 under the weight-storage knobs
    (issue 32); ``weights``: the bytes without them.

    ``fp8_params`` (Megatron ``--fp8-param-gather``: "Keep the compute param in fp8 (do not use
    any other intermediate dtype) and perform the param all-gather in fp8", NVIDIA/Megatron-LM@d98e8a6
    megatron/training/arguments.py; the parameters are Transformer Engine fp8 tensors,
    ``TransformerConfig.fp8_param``, and the distributed optimizer's parameter buffer is
    ``torch.uint8``, megatron/core/distributed/param_and_grad_buffer.py): below ZeRO-3 the
    weight is 1 byte - no bf16 weight and no separate fp8 cache (2 + 1 bytes become 1); the fp32
    master stays in the optimizer (12 bytes, sharded). At ZeRO-3 the sharded fp32 master is the
    parameter already and the fp8 shard replaces the fp8 cache byte for byte: unchanged. As for
    the cache, TE's transpose is not counted (made per GEMM in this model).

    ``reuse_fp32`` (MindSpeed ``--reuse-fp32-param``, Ascend/MindSpeed@028de58
    docs/zh/features/reuse-fp32-param.md): "FP32 = BF16 + Residual" - the fp32 master is rebuilt
    before the optimizer step from the bf16 weight and a saved 16-bit residual, so it costs 2
    bytes, not 4: the optimizer term is 10 bytes (residual + m + v), sharded as before. This is
    the saving the page states: ``sizeof(bfloat16) x params`` without the distributed optimizer,
    ``sizeof(bfloat16) x params / DP`` with it. ZeRO-3 and fp16 are refused (plan.py)."""
    if fp8_params and dtype == "fp8":
        weights = params * 1.0
    if reuse_fp32 and dtype in ("bf16", "fp8"):
        opt_b -= 2
    return weights, opt_b


def _shape_params(model: ModelSpec, plan: Plan, shape: RankShape) -> tuple[float, float]:
    return shape_params(model, shape, param_shape(plan))


def tp_replicated_params(model: ModelSpec, moe: bool) -> int:
    """Parameters of one layer that tensor parallelism replicates instead of splitting.

    Megatron-LM and PyTorch's tensor/sequence parallel split the projection and MLP
    GEMMs only: the two norms' weights are full on every tp rank (Megatron marks them
    ``sequence_parallel`` and all-reduces their gradients over tp; torch's
    ``SequenceParallel`` style replicates them), as are Qwen3's per-head q/k norms and the
    MoE router (Megatron-Core ``TopKRouter`` holds the whole ``[E, h]`` weight on every
    tp rank) and the shared-expert gate. Partita's runtime does the same (the oracle in
    tests/data/cost_oracles.json counts the tensors each tp rank holds)."""
    return _tp_replicated(model, moe)


@memoised
def _tp_replicated(model: ModelSpec, moe: bool) -> int:
    h = model.hidden
    norm = 2 if model.norm == "layernorm" else 1
    params = 2 * norm * h
    if model.qk_norm:
        params += 2 * model.head_size
    if moe and model.moe:
        params += h * model.moe.num_experts + (h if model.moe.shared_expert_gate else 0)
    return params


def _end_replicated(model: ModelSpec, first: bool) -> int:
    """Replicated parameters of the embedding (learned positions - Megatron keeps them in
    a plain ``nn.Embedding`` - and BLOOM's embedding norm) or the output layer (the final
    norm); the vocabulary-parallel matrices are split."""
    norm = (2 if model.norm == "layernorm" else 1) * model.hidden
    if first:
        return (model.max_positions * model.hidden if model.position == "learned" else 0) + \
            (norm if model.embedding_norm else 0)
    return norm


def _split_tp(total: float, replicated: float, tp: int) -> float:
    """Parameters one tp rank holds of ``total``, of which ``replicated`` are not split."""
    return (total - replicated) / tp + replicated


@memoised
def shape_params(model: ModelSpec, rank: RankShape, split: ParamShape) -> tuple[float, float]:
    """(dense, expert) parameters of a pipeline rank of this shape: tp divides the dense
    weights except the replicated ones (:func:`tp_replicated_params`: norms, router), ep x
    etp the routed experts (module docstring)."""
    n_dense = rank.n_layers - rank.n_moe
    tp = split.tp
    dense = n_dense * _split_tp(model.layer_kind_params(False), _tp_replicated(model, False), tp) if n_dense else 0.0
    expert = 0.0
    if rank.n_moe:
        routed = model.moe.num_experts * model.routed_expert_params()  # type: ignore[union-attr]
        expert = rank.n_moe * routed / (split.ep * split.etp)
        dense += rank.n_moe * _split_tp(model.layer_kind_params(True) - routed, _tp_replicated(model, True), tp)
    if rank.first:
        dense += _split_tp(model.embedding_params(), _end_replicated(model, True), tp)
    if rank.last:
        out = model.output_params()
        if model.tied_embeddings and split.pipelined:
            out += model.vocab * model.hidden  # the last stage keeps its own copy of the tied weight
        dense += _split_tp(out, _end_replicated(model, False), tp)
    return dense, expert
