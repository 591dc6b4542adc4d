"""Transient memory: what a rank holds only for part of the step, at its peak - one
layer's backward working set or the loss phase's logits, ZeRO-3's gathered units, and
the all-gather pool FSDP2's caching allocator keeps reserved.

The last rank's loss phase holds the logits and what the framework's loss makes of them
(:func:`loss_bytes_per_logit`: 6 bytes per logit for Megatron's fused cross-entropy, 4 for
torchtitan's compiled loss, 12 for an eager ``F.cross_entropy(logits.float())``, measured
with torch's allocator events). Under FSDP2 the caching allocator also keeps the largest
flat all-gather buffer reserved on its own stream (:func:`fsdp_stream_pool`), which
``max_memory_reserved`` counts and ``max_memory_allocated`` does not.
"""
from __future__ import annotations

from ..plan import Plan
from ..spec.model import ModelSpec
from .activations import layer_working_bytes, unfused_attention_bytes
from .compute import BYTES
from .memo import memoised
from .placement import RankShape
from .shape import ParamShape, layer_shape, param_shape
from .states import _end_replicated, _grad_bytes, _split_tp, _tp_replicated


def _layer_working(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """The largest working set of one of the rank's edge layers' backward (its full
    activations and their gradients; unfused attention: its probabilities and their
    gradient, :func:`unfused_attention_bytes` twice)."""
    working = 0.0
    layer = layer_shape(plan)
    for moe in shape.edge_moe:
        working = max(working, layer_working_bytes(model, layer, moe))
    return working + 2 * unfused_attention_bytes(model, plan)


#: How each framework (:mod:`.frameworks`) runs the loss over the logits, which decides the
#: bytes per logit element its loss phase holds at once (:func:`loss_bytes_per_logit`).
#: Keyed by the plan's framework name; a name missing here runs as Megatron (``fused``).
LOSS_MODE: dict[str, str] = {
    "megatron": "fused", "mindspeed": "fused", "deepspeed": "fused",
    "torchtitan": "compiled", "torchtitan-eager": "eager", "partita": "eager-kept",
    # torchtitan with compiled blocks and an eager loss: every run before torchtitan commit
    # bbb1b616e (2025-04-02; loss.py had "# compiled_cross_entropy_loss = torch.compile(...)"
    # commented out) and ``--compile.components model`` today. Not yet a plan framework.
    "torchtitan-eager-loss": "eager",
}


def loss_bytes_per_logit(mode: str, dtype: str) -> float:
    """Peak bytes per logit element (token x vocabulary entry of the rank's shard) while the
    loss and its backward run, the 16-bit (``e`` = 2) or fp32 (``e`` = 4) logits included.

    * ``fused`` (Megatron-LM / MindSpeed / Megatron-DeepSpeed ``VocabParallelCrossEntropy``,
      megatron/core/tensor_parallel/cross_entropy.py): the logits are cast to fp32 once and
      max-subtraction, exp and normalisation run in place on that copy, which is the softmax
      kept for backward; the backward writes the gradient into it in place. Peak: the
      ``e``-byte logits and the fp32 softmax, ``e + 4``.
    * ``eager`` (torchtitan without compile, torchtitan before it compiled the loss:
      ``F.cross_entropy(pred.float(), labels)``, torchtitan/components/loss.py, and ``del
      pred`` before backward): forward holds the logits, their fp32 copy and log_softmax's
      fp32 output (``e + 4 + 4``; the copy is not saved, log_softmax's backward needs its
      output only); backward holds the saved output, nll_loss's fp32 gradient and
      log_softmax's fp32 input gradient: ``12``. Peak ``max(e + 8, 12)`` = 12 (fp32: the cast
      is a no-op, forward 8).
    * ``eager-kept`` (partita's train step keeps ``out`` referenced through backward): the
      eager backward plus the logits, ``12 + e``.
    * ``compiled`` (torchtitan with compile on compiles the loss, ``build_cross_entropy_loss``
      since torchtitan commit bbb1b616e, 2025-04-02): AOTAutograd's min-cut partitioner saves
      the ``e``-byte logits (not the fp32 log-softmax) and the backward writes an ``e``-byte
      gradient: ``2 e``.

    The last three are measured: torch.profiler's allocator events during forward + backward
    of an output layer and that loss (tests/measure_memory_physics.py, recorded in
    tests/data/memory_physics_oracles.json: 12.0, 12.0 (fp32), 14.0, 4.0 and 8.0 (fp32) bytes)."""
    e = BYTES[dtype]
    if mode == "eager":
        return max(e + 8.0, 12.0)
    if mode == "eager-kept":
        return 12.0 + e
    if mode == "compiled":
        return 2.0 * e
    return e + 4.0


def _logits_bytes(model: ModelSpec, plan: Plan) -> float:
    """What the loss phase of one micro-batch holds: the rank's ``tokens x vocab / tp`` logit
    elements times :func:`loss_bytes_per_logit` of the plan's framework."""
    tokens = plan.mbs * plan.seq_len / plan.cp
    return tokens * model.vocab / plan.tp * loss_bytes_per_logit(LOSS_MODE.get(plan.framework, "fused"), plan.dtype)


def _transient(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """One layer's backward working set or, on the last rank, the logits and softmax,
    whichever is larger (they are never held at once)."""
    working = _layer_working(model, plan, shape)
    if shape.last:
        working = max(working, _logits_bytes(model, plan))
    return working


def _zero3_gathered(model: ModelSpec, plan: Plan, shape: RankShape, zero: int | None = None) -> float:
    """What fully-sharded data parallelism (FSDP2 / ZeRO-3) holds unsharded at the peak,
    on top of the sharded states (``zero`` overrides the plan's stage).

    The peak is the start of backward, when every layer's activations are held. At that
    moment, for the unit ``U`` being differentiated (the largest FSDP unit the rank has:
    a layer, or the embedding / output layer, which are their own units in torchtitan's
    ``apply_fsdp``) and a layer ``L`` next to it:

    * ``U`` gathered in the working dtype (``w`` = 2 bytes, fp32 training 4) and the next
      unit's all-gather output already allocated by the prefetch: ``w (U + L)``. PyTorch's
      FSDP notes (docs.pytorch.org/docs/stable/notes/fsdp.html, "FSDP Prefetch Nuances"):
      prefetching means "the next all-gather's output tensor must be allocated while the
      current one is still in use"; backward prefetch is on by default in FSDP2.
    * ``U``'s unsharded gradients in the reduce dtype (``g U``; fp32 with torchtitan's
      default ``mixed_precision_reduce = "float32"``): FSDP2's ``foreach_reduce`` copies
      the gradients into one flat reduce-scatter input (unsharded numel x reduce dtype).
    * the previous unit's reduce-scatter input is not added: FSDP2 keeps it until the
      next unit's post-backward (so the CPU cannot run ahead of the reduce-scatter
      stream) and frees it there, before allocating the next input
      (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py, ``post_backward`` /
      ``reduce_scatter_state``).

    Total ``U (w + g) + w L``. The unit is the largest one, not the average layer: for
    Llama-3-8B the output layer (525 M parameters) against a layer (218 M), so 3.4 GiB
    instead of the 1.9 GiB the average-layer count gave.

    The last rank's output layer is differentiated while the logits are alive, and its
    reduce-scatter input is allocated only after they are freed (autograd frees a node's
    saved tensors and its incoming gradient once the node has run; FSDP2 allocates the
    reduce-scatter input in the unit's post-backward hook, after its backward). So the
    logits (:func:`_logits_bytes`) and the output layer's ``g U_out`` never coexist; the
    last rank's peak is the largest of three phases, each over the activations:

    * loss and output-layer backward: the logits, the gathered output weight and its
      working-dtype gradient, the last layer prefetched: ``T_logits + 2 w U_out + w L``;
    * the last layer's backward: its working set, the output layer's reduce-scatter input
      (held until this layer's post-backward) and the layer gathered plus the next one
      prefetched: ``T_layer + g U_out + 2 w L``;
    * the other units as above: ``T_layer + U (w + g) + w L``.

    This part is that peak less the transient part (:func:`_transient`), so the parts
    still add up to it. Known gaps: the momentary working-dtype gradients of a layer
    while they are copied into the reduce-scatter input (``w U`` for a few kernels);
    ``reshard_after_forward=False`` units (torchtitan's last block under pp) stay
    gathered through forward and backward.
    """
    if (plan.zero if zero is None else zero) < 3:
        return 0.0
    layer, unit, out = _fsdp_units(model, param_shape(plan), shape)
    w, g = (4 if plan.dtype == "fp32" else 2), _grad_bytes(plan)
    if plan.framework == "deepspeed":
        return min(_deepspeed_zero3_gathered(model, plan, w), unit * (w + g) + layer * w)
    if not shape.last:
        return unit * (w + g) + layer * w
    t_layer, t_logits = _layer_working(model, plan, shape), _logits_bytes(model, plan)
    loss_phase = t_logits + 2 * w * out + w * layer
    after_output = t_layer + g * out + 2 * w * layer
    other_units = t_layer + unit * (w + g) + layer * w
    return max(loss_phase, after_output, other_units) - max(t_layer, t_logits)


#: DeepSpeed ZeRO-3's defaults (deepspeed/runtime/zero/config.py, DeepSpeedZeroConfig):
#: ``stage3_max_live_parameters`` 1e9 parameters gathered at once, ``reduce_bucket_size`` 5e8
#: gradient elements per reduce-scatter bucket.
DEEPSPEED_MAX_LIVE_PARAMS = 1e9
DEEPSPEED_REDUCE_BUCKET = 5e8


def _largest_linear(model: ModelSpec, tp: int) -> float:
    """Parameters of a dense layer's largest weight matrix on one tensor-parallel rank: the
    first MLP projection (``h x 2f`` fused gate and up when gated, ``h x f`` otherwise) or
    the fused QKV projection (``h x (q + 2 kv)``)."""
    h = model.hidden
    mlp = h * model.ffn_hidden * (2 if model.gated else 1)
    qkv = h * (model.q_dim + 2 * model.kv_dim) if not model.mla else 0
    return max(mlp, qkv) / tp


def _deepspeed_zero3_gathered(model: ModelSpec, plan: Plan, w: int) -> float:
    """What DeepSpeed ZeRO-3 holds unsharded at the peak: ``w (max(M, S) + B + S)``.

    DeepSpeed gathers parameters per submodule, not per layer: the partitioned-parameter
    coordinator fetches the parameters of the submodule about to run (and prefetches the
    next ones) and releases gathered parameters once more than ``stage3_max_live_parameters``
    (``M``, default 1e9) are resident (deepspeed/runtime/zero/partitioned_param_coordinator.py,
    ``fetch_sub_module`` / ``release_sub_module``; config.py: "The maximum number of
    parameters resident per GPU before releasing"). A submodule larger than ``M`` is still
    gathered whole, so at most ``max(M, S)`` working-dtype parameters, ``S`` the largest
    weight matrix (:func:`_largest_linear`). Gradients are not kept per layer in the reduce
    dtype as FSDP2 does: each submodule's working-dtype gradients (``S`` at most) are copied
    into the reduce bucket of ``reduce_bucket_size`` (``B``, default 5e8) elements and
    reduce-scattered into the fp32 partition (stage3.py, ``__add_grad_to_ipg_bucket`` /
    ``__reduce_and_partition_ipg_grads``). The caller caps it at the FSDP2-style count
    (a layer gathered with its gradients), which is smaller for small models. Known gaps:
    MoE expert weights are taken as the dense MLP; a run that lowered ``M`` or ``B`` holds less."""
    s = _largest_linear(model, plan.tp)
    return w * (max(DEEPSPEED_MAX_LIVE_PARAMS, s) + DEEPSPEED_REDUCE_BUCKET + s)


#: Frameworks whose zero 3 is PyTorch FSDP2 ``fully_shard`` (:func:`fsdp_stream_pool`).
FSDP2_FRAMEWORKS = frozenset({"torchtitan", "torchtitan-eager", "torchtitan-eager-loss", "partita"})


def fsdp_stream_pool(model: ModelSpec, plan: Plan, shape: RankShape, zero: int | None = None) -> float:
    """Bytes FSDP2 keeps reserved in the all-gather stream's pool of the caching allocator,
    beyond what is allocated at the peak: ``w U_max``, the working-dtype flat all-gather
    output of the rank's largest unit (a layer, the embedding or the output layer).

    Derivation: FSDP2 allocates each unit's flat all-gather output on its
    ``all_gather_copy_in_stream`` (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py,
    ``foreach_all_gather``: ``all_gather_comm.allocate`` under ``device_handle.stream(
    all_gather_copy_in_stream)``), copies it out into the parameters' own unsharded storage
    on the default stream (``foreach_all_gather_copy_out``: ``torch.empty_like``) and frees
    it before the next unit's all-gather (``FSDPParamGroup.unshard``: "free the all-gather
    result"). The CUDA caching allocator hands a freed block only to later allocations on
    the stream it was allocated on (c10/cuda/CUDACachingAllocator.cpp, blocks and expandable
    segments are per stream), so the largest flat buffer stays reserved for that stream
    while the default stream reaches its peak: ``torch.cuda.max_memory_reserved`` (what
    torchtitan logs) counts it, ``max_memory_allocated`` does not. ``w`` = 2 (bf16
    all-gather; fp32 training 4). Known gaps: float8 all-gather (torchao tensorwise) sends 1
    byte; two flat buffers may coexist when a prefetched all-gather is allocated before the
    previous result is freed; the reduce-scatter stream's pool (the sharded fp32 gradients)
    is counted as the gradients already."""
    if (plan.zero if zero is None else zero) < 3 or plan.framework not in FSDP2_FRAMEWORKS:
        return 0.0
    layer, unit, out = _fsdp_units(model, param_shape(plan), shape)
    return (4 if plan.dtype == "fp32" else 2) * max(layer, unit, out)


@memoised
def _fsdp_units(model: ModelSpec, split: ParamShape, shape: RankShape) -> tuple[float, float, float]:
    """(largest layer, largest unit but the output layer, output layer) parameters of a
    rank's FSDP units (memoised: the search asks once per layout and ZeRO setting)."""
    layer = _unit_params(model, split, shape)
    unit = layer
    if shape.first:
        unit = max(unit, _split_tp(model.embedding_params(), _end_replicated(model, True), split.tp))
    out = 0.0
    if shape.last:
        out = model.output_params()
        if model.tied_embeddings and split.pipelined:
            out += model.vocab * model.hidden  # the last stage's own copy of the tied weight
        out = _split_tp(out, _end_replicated(model, False), split.tp)
    return layer, unit, out


def _unit_params(model: ModelSpec, split: ParamShape, shape: RankShape) -> float:
    """Parameters of the rank's largest layer (its dense part / tp, its experts / (ep*etp))."""
    tp = split.tp
    params = (_split_tp(model.layer_kind_params(False), _tp_replicated(model, False), tp)
              if shape.n_layers > shape.n_moe else 0.0)
    if shape.n_moe:
        routed = model.moe.num_experts * model.routed_expert_params()  # type: ignore[union-attr]
        params = max(params, _split_tp(model.layer_kind_params(True) - routed, _tp_replicated(model, True), tp)
                     + routed / (split.ep * split.etp))
    return params
