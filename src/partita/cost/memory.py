"""Per-rank memory: the parts a pipeline rank holds at its peak, put together.

Each part has its own module; this one assembles them into :class:`MemoryParts` - the one
record every memory figure (the breakdown ``partita estimate`` prints, the peak, the
search's ladder) is summed from - and answers "does it fit":

* :mod:`.states`      - weights, gradients and optimizer states (ZeRO / FSDP sharding,
  expert parallel), and the parameters a rank holds;
* :mod:`.activations` - what each layer keeps for backward (Korthikanti et al. 2022),
  per in-flight model chunk;
* :mod:`.placement`   - which layers each pipeline rank holds (:class:`RankShape`);
* :mod:`.transient`   - one layer's backward working set or the loss phase, ZeRO-3's
  gathered units and FSDP2's all-gather pool;
* here: communicator buffers and the gradient knobs' state, and the sums.

The search's partial-recompute solver (the least ``recompute_layers`` that fits) is
:mod:`partita.search.partial_recompute`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from ..plan import Plan
from ..spec.hardware import Device
from ..spec.model import ModelSpec
# noqa F401 below: re-exported, as tests/, cost/traced.py and the docs name them by this path
from .activations import (_activations_per_chunk, activation_bytes, activation_bytes_per_layer,  # noqa: F401
                          eager_extra_bytes, unfused_attention_bytes)
from .compression import state_bytes, wire_count
from .finetune import lora_memory_parts, trained_shape_params
from .frameworks import FRAMEWORKS
from .pipeline import in_flight_chunks
from .placement import RankShape, distinct_shapes, rank_shapes
from .shape import LayerShape, layer_shape
from .step import _ddp_wraps
from .states import (_grad_bytes, _shape_params, _state_bytes, device_optimizer_bytes, device_optimizer_share,  # noqa: F401
                     expert_state_shard, fp8_weight_cache, moment_saving, full_gradients, grad_bytes, model_state_bytes,
                     shape_params, state_shard, stored_moment_dtype,
                     tp_replicated_params)
from .transient import (LOSS_MODE, _transient, _zero3_gathered, fsdp_stream_pool,  # noqa: F401
                        loss_bytes_per_logit)

GIB = 1024 ** 3


def memory_limit_gib(device: Device, headroom: float, cap_gib: float | None = None) -> float:
    """The memory a plan may use per device (GiB): the device's usable memory less the
    ``headroom`` fraction kept free for spikes the model does not see, and at most
    ``cap_gib`` when given. The search keeps ``SearchSpace.memory_headroom`` (5 %) free;
    ``partita estimate`` reports against the whole usable memory (headroom 0)."""
    limit = device.usable_gib * (1 - headroom)
    if cap_gib:
        limit = min(limit, cap_gib)
    return limit


def fits(peak_bytes: float, limit_gib: float) -> bool:
    """The one meaning of "fits": the peak of the most loaded rank, allocator slack and
    runtime reservation included (:func:`peak_memory`), is within ``limit_gib``
    (:func:`memory_limit_gib`)."""
    return peak_bytes / GIB <= limit_gib


@dataclass
class RankMemory:
    """Memory of one pipeline rank, bytes by component."""

    rank: int
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def _buffers(device: Device, plan: Plan) -> float:
    """Per-communicator buffers (HCCL: 2 x HCCL_BUFFSIZE each) for every group the rank is in."""
    groups = sum(1 for size in (plan.tp, plan.dp * plan.cp, plan.pp, plan.cp, plan.ep, plan.etp) if size > 1) + 1
    return groups * device.comm_buffer_mib_per_group * 2 ** 20


def _knob_state(model: ModelSpec, plan: Plan, shape: RankShape) -> float:
    """What a gradient-communication knob keeps between steps on this rank, counted with the
    communication buffers: PowerSGD's error feedback (a copy of every gradient it reduces)
    and its warm-start P, Q factors (:func:`.compression.state_bytes`, equal to what torch's
    ``PowerSGDState`` allocates: tests/test_compression.py); 0 for every other plan."""
    if plan.grad_compression != "powersgd" or plan.dp * plan.cp <= 1:
        return 0.0
    dense, expert = _shape_params(model, plan, shape)
    return state_bytes(plan, wire_count(model, plan, dense + expert, shape.n_layers, shape.n_moe,
                                        shape.first, shape.last))


class MemoryParts(NamedTuple):
    """Bytes one pipeline rank holds at its peak, by part (:func:`memory_parts`). Every
    memory figure - the breakdown `partita estimate` prints, the peak, the search's
    ladder - is this record summed by :meth:`allocated` / :meth:`peak`."""

    weights: float
    gradients: float
    optimizer: float
    activations: float  # in-flight micro-batches x activation bytes per model chunk
    transient: float  # one layer's backward working set, or the logits and softmax
    zero3_gathered: float  # ZeRO-3: unsharded layers being used / prefetched
    buffers: float  # communicator buffers
    #: reserved but not allocated at the peak: FSDP2's all-gather pool (:func:`fsdp_stream_pool`)
    stream_pool: float = 0.0
    #: the gradients are alive through the whole step (:func:`gradients_persist`); ``gradients``
    #: is what the rank holds after backward either way
    gradients_persist: bool = True

    def gradients_at_peak(self) -> float:
        """Gradient bytes alive at the peak: all of them when they persist, else
        ``max(0, gradients - activations)``, so the peak holds ``max(activations, gradients)
        + transient`` instead of their sum.

        Why: after ``zero_grad(set_to_none=True)`` no gradient exists during the forward and
        the loss phase, where the activations are all alive; backward then frees layer ``i``'s
        activations as it creates layer ``i``'s gradients. With ``L`` like layers, at layer
        ``i`` from the top the rank holds about ``(i/L) G + (1 - i/L) A`` plus one layer's
        working set (at most the transient): linear in ``i``, so its largest value is at an
        end - ``A`` at the start, ``G`` at the end - and ``max(A, G) + transient`` bounds the
        step. Measured: the full SFT run of tests/measure_lora_memory.py peaks in
        ``LogSoftmaxBackward0``, before the first ``AccumulateGrad`` (torch.profiler memory
        events; docs/finetune.md)."""
        if self.gradients_persist:
            return self.gradients
        return max(0.0, self.gradients - self.activations)

    def allocated(self) -> float:
        """What the rank allocates at its peak: the sum of the parts, the gradients as
        :meth:`gradients_at_peak` counts them."""
        return (self.weights + self.gradients_at_peak() + self.optimizer + self.activations + self.transient
                + self.zero3_gathered + self.buffers)

    def peak(self, device: Device) -> float:
        """Peak device memory: allocated, plus the allocator's fragmentation slack on it and
        the blocks it keeps for other streams (:attr:`stream_pool`), plus the runtime's own
        reservation (context, workspaces)."""
        allocated = self.allocated()
        return (allocated + allocated * device.allocator_fragmentation + self.stream_pool
                + device.runtime_reserved_gib * GIB)

    def breakdown(self, device: Device) -> dict[str, float]:
        """The parts by label, as `partita estimate` prints them (their sum is :meth:`peak`;
        ``gradients``: those alive at the peak, :meth:`gradients_at_peak`)."""
        out = {"weights": self.weights, "gradients": self.gradients_at_peak(), "optimizer": self.optimizer,
               "activations": self.activations, "transient": self.transient}
        if self.zero3_gathered:
            out["zero3 gathered layers"] = self.zero3_gathered
        out["communication buffers"] = self.buffers
        allocated = self.allocated()
        # reserved, not allocated: read as such by Estimate.peak_memory_gib_as("allocated")
        out["allocator fragmentation"] = allocated * device.allocator_fragmentation + self.stream_pool
        out["runtime (context, workspaces)"] = device.runtime_reserved_gib * GIB
        return out


class PlanTerms(NamedTuple):
    """What :func:`memory_parts` takes from the plan alone - the same for every rank shape
    and every (recompute, zero) setting of a layout (:func:`plan_terms`)."""

    grad_bytes: int  # bytes per main-gradient element (:func:`.states.grad_bytes`)
    dense_shard: int  # ranks the dense states are sharded over (HSDP: the shard group only)
    expert_shard: int  # ranks the routed-expert states are sharded over (expert data parallel)
    buffers: float  # communicator buffers (:func:`_buffers`)
    full_gradients: bool  # gradients held unsharded (:func:`.states.full_gradients`)
    fp8_cache: bool  # an fp8 copy of each weight kept (:func:`.states.fp8_weight_cache`)
    layer: LayerShape  # the plan's layer shape (:func:`.shape.layer_shape`)
    zero0_autocast: bool  # the framework trains zero 0 under autocast over fp32 parameters


def plan_terms(device: Device, plan: Plan) -> PlanTerms:
    """The :class:`PlanTerms` of ``plan`` on ``device``."""
    return PlanTerms(_grad_bytes(plan), state_shard(plan), expert_state_shard(plan), _buffers(device, plan),
                     full_gradients(plan), fp8_weight_cache(plan), layer_shape(plan),
                     FRAMEWORKS[plan.framework].zero0_autocast)


def memory_parts(model: ModelSpec, device: Device, plan: Plan, rank: int, shape: RankShape,
                 settings: list[tuple[str, int]], terms: PlanTerms | None = None) -> dict[tuple[str, int], MemoryParts]:
    """The memory parts of pipeline rank ``rank`` (of shape ``shape``) under each
    (recompute, zero) setting of ``plan``'s layout - the one place the parts are made.
    The ZeRO stage only changes the model states and the recompute mode only the
    activations, so each is computed once and combined. ``terms``: :func:`plan_terms`
    of the plan, when the caller walks several rank shapes."""
    dense, expert = _shape_params(model, plan, shape)
    # unpacked once: the search's hot path (every layout's ladder over every rank shape)
    grad_b, dense_shard, expert_shard, plan_buffers, full, fp8_cache, layer, zero0_autocast = \
        plan_terms(device, plan) if terms is None else terms
    master = FRAMEWORKS[plan.framework].master_in_params  # MindSpore: the 16-bit parameters are the master
    chunks = in_flight_chunks(plan.schedule, plan.pp, plan.vpp, plan.grad_accum, rank)
    transient, buffers = _transient(model, plan, shape), plan_buffers + _knob_state(model, plan, shape)
    states: dict[int, tuple[float, float, float, float, float]] = {}
    activations: dict[str, float] = {}
    out = {}
    for recompute, zero in settings:
        if zero not in states:
            autocast = zero == 0 and zero0_autocast
            weights, grads, optimizer = _state_bytes(plan.dtype, grad_b, zero, dense, dense_shard, full, autocast,
                                                     fp8_cache, plan.fp8_param_gather, plan.reuse_fp32_param, master)
            if expert:
                we, ge, oe = _state_bytes(plan.dtype, grad_b, zero, expert, expert_shard, full, autocast, fp8_cache,
                                          plan.fp8_param_gather, plan.reuse_fp32_param, master)
                weights, grads, optimizer = weights + we, grads + ge, optimizer + oe
            # --use-precision-aware-optimizer's narrower states, --optimizer-cpu-offload's host share (states.py)
            optimizer = device_optimizer_bytes(plan, zero, optimizer, ((dense, dense_shard), (expert, expert_shard)))
            states[zero] = (weights, grads, optimizer, _zero3_gathered(model, plan, shape, zero),
                            fsdp_stream_pool(model, plan, shape, zero)) if zero >= 3 else \
                (weights, grads, optimizer, 0.0, 0.0)  # both are 0 below zero 3
        if recompute not in activations:
            activations[recompute] = chunks * _activations_per_chunk(model, plan, shape, recompute, layer)
        weights, grads, optimizer, gathered, pool = states[zero]
        out[(recompute, zero)] = MemoryParts(weights, grads, optimizer, activations[recompute], transient, gathered,
                                             buffers, pool)
    if plan.finetune == "lora":  # frozen base weights and trainable adapters (cost/finetune.py)
        out = lora_memory_parts(model, plan, shape, out, grad_b, (dense_shard, expert_shard), full, fp8_cache,
                                zero0_autocast)
    if not gradients_persist(plan):
        out = {k: p._replace(gradients_persist=False) for k, p in out.items()}
    return out


def gradients_persist(plan: Plan) -> bool:
    """Whether the gradients are alive through the whole step, the loss phase included: the
    framework keeps a gradient buffer across steps (:attr:`.frameworks.Framework.persistent_grad_buffer`),
    torch DDP wraps the model (its buckets are allocated once, ``gradient_as_bucket_view`` or
    not: torch/csrc/distributed/c10d/reducer.cpp), or a later micro-batch's forward runs while
    the earlier micro-batches' gradients are accumulated (``grad_accum > 1``); else
    :meth:`MemoryParts.gradients_at_peak` counts them."""
    return (FRAMEWORKS[plan.framework].persistent_grad_buffer or plan.grad_accum > 1
            or (_ddp_wraps(plan) and plan.dp * plan.cp > 1))


def peak_memory_ladder(model: ModelSpec, device: Device, plan: Plan,
                       steps: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[float, int]]:
    """:func:`peak_memory` for several (recompute, zero) settings of one layout at once
    (the search's memory ladder): (bytes, pipeline rank) of the most loaded rank of each,
    each peak :meth:`MemoryParts.peak`."""
    out: dict[tuple[str, int], tuple[float, int]] = {step: (-1.0, 0) for step in steps}
    terms = plan_terms(device, plan)
    for r, shape, _ in distinct_shapes(model, plan):
        for step, parts in memory_parts(model, device, plan, r, shape, steps, terms).items():
            total = parts.peak(device)
            if total > out[step][0]:
                out[step] = (total, r)
    return out


def estimate_rank_memory(model: ModelSpec, device: Device, plan: Plan, rank: int) -> RankMemory:
    """Peak memory of pipeline rank ``rank`` (bytes per component)."""
    setting = (plan.recompute, plan.zero)
    parts = memory_parts(model, device, plan, rank, rank_shapes(model, plan)[rank], [setting])[setting]
    return RankMemory(rank=rank, parts=parts.breakdown(device))


def estimate_memory(model: ModelSpec, device: Device, plan: Plan) -> list[RankMemory]:
    """Memory of every pipeline rank (index = pipeline rank)."""
    return [estimate_rank_memory(model, device, plan, r) for r in range(plan.pp)]


def peak_memory(model: ModelSpec, device: Device, plan: Plan) -> tuple[float, int]:
    """(bytes, pipeline rank) of the most loaded rank - the same numbers as
    :func:`estimate_memory`'s totals, without building the breakdowns."""
    setting = (plan.recompute, plan.zero)
    return peak_memory_ladder(model, device, plan, [setting])[setting]


def dp_gradient_bytes(model: ModelSpec, plan: Plan) -> dict[str, float]:
    """Per-step data-parallel gradient bytes of the rank holding the most parameters:
    ``held`` (the gradient buffer as the reduction would send it uncompressed, fp32),
    ``wire`` (what the plan's knobs send: grad_dtype, PowerSGD), ``ratio`` = wire/held,
    plus PowerSGD's ``state`` bytes (error feedback + factors). Bytes are the all-reduce
    buffer size (nccl-tests convention, :mod:`.comm`), per reduction; 0 when dp x cp = 1."""
    best = {"held": 0.0, "wire": 0.0, "ratio": 1.0, "state": 0.0, "elements": 0.0}
    if plan.dp * plan.cp <= 1:
        return best
    for _, shape, _ in distinct_shapes(model, plan):
        dense, expert = trained_shape_params(model, plan, shape)  # LoRA: the adapters' gradients only
        elements = dense + expert
        c = wire_count(model, plan, elements, shape.n_layers, shape.n_moe, shape.first, shape.last)
        held = elements * 4
        wire = c.wire_elements * _grad_bytes(plan)
        if held > best["held"]:
            best = {"held": held, "wire": wire, "ratio": wire / held if held else 1.0,
                    "state": state_bytes(plan, c), "elements": elements}
    return best
