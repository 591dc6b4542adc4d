"""``estimate(model, cluster, plan)``: memory and step time of one plan, explained.

This is the entry point of the cost model; :mod:`partita.cost` holds the formulas.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cost.memory import GIB, RankMemory, estimate_memory
from .cost.step import StepTime, estimate_step_time
from .cost.term_sources import term_sources
from .plan import Plan, check, normalise
from .spec.hardware import Cluster
from .spec.model import ModelSpec
from . import uncertainty as unc
from .uncertainty import DEFAULT_HEADROOM, DEFAULT_MIN_P_FIT, MemoryLimit


#: Fraction of usable memory `partita estimate` keeps free by default: the one default of
#: every command (:data:`partita.uncertainty.DEFAULT_HEADROOM`).
ESTIMATE_HEADROOM = DEFAULT_HEADROOM


@dataclass
class Estimate:
    """Predicted memory and speed of a plan; the numbers `partita estimate` prints."""

    model: ModelSpec
    cluster: Cluster
    plan: Plan
    time: StepTime
    _memory: list[RankMemory] | None = None
    #: the memory it must fit in: a :class:`MemoryLimit` (how it is made up is named in the
    #: verdict), a number of GiB, or None: the device's usable memory less the default headroom.
    #: The search sets its own limit (headroom and cap) on the plans it returns.
    memory_limit: MemoryLimit | float | None = None
    #: below this P(fit) the plan "does not fit" (``--min-p-fit``)
    min_p_fit: float = DEFAULT_MIN_P_FIT
    #: P(fit) when the caller computed it already (the search, from the peak it had)
    _p_fit: float | None = None
    #: the limit ``_p_fit`` was computed against (None: the limit the estimate was made with)
    _p_fit_limit: float | None = None

    @property
    def memory(self) -> list[RankMemory]:
        """Per-pipeline-rank memory breakdowns (computed on first use: the search builds
        thousands of estimates and prints few)."""
        if self._memory is None:
            self._memory = estimate_memory(self.model, self.cluster.device, self.plan)
        return self._memory

    @property
    def step_time_s(self) -> float:
        return self.time.step

    @property
    def peak_rank(self) -> RankMemory:
        return max(self.memory, key=lambda m: m.total)

    @property
    def peak_memory_gib(self) -> float:
        return self.peak_rank.total / GIB

    def peak_memory_gib_as(self, statistic: str) -> float:
        """The peak as a given memory statistic reads it (GiB), so a measurement is
        compared with the same quantity: ``allocated`` (``torch.cuda.max_memory_allocated``,
        Megatron's mem-max-allocated): the parts alone; ``reserved``
        (``max_memory_reserved``, torchtitan's "memory" log): plus the caching allocator's
        fragmentation; anything else (nvidia-smi / npu-smi, or not stated): the whole peak,
        the runtime's own reservation (context, workspaces) included."""
        parts = self.peak_rank.parts
        total = self.peak_rank.total
        if statistic == "allocated":
            total -= parts.get("allocator fragmentation", 0.0) + parts.get("runtime (context, workspaces)", 0.0)
        elif statistic == "reserved":
            total -= parts.get("runtime (context, workspaces)", 0.0)
        return total / GIB

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.plan.tokens_per_step / self.step_time_s / self.cluster.world_size

    @property
    def model_flops_per_step(self) -> float:
        """The MFU numerator: ``6 N + 3 A`` per token (:meth:`ModelSpec.model_flops_per_token`).
        A LoRA step does no weight gradient for the frozen weights, so its model FLOPs are the
        forward ``2 N`` and the input gradient ``2 N``, with attention's forward and backward
        unchanged (it has no weights): ``4 N + 3 A`` (the adapters' own FLOPs, ``r / h`` of
        these, are not counted, as 6 N counts no norm or softmax) - else a LoRA plan's MFU
        reads 1.5x too high."""
        model, seq = self.model, self.plan.seq_len
        if self.plan.finetune == "lora" and hasattr(model, "matmul_params_per_token"):
            per_token = 4 * model.matmul_params_per_token() + 3 * model.attention_flops_per_token(seq, True)
        else:
            per_token = model.model_flops_per_token(seq)
        return per_token * self.plan.tokens_per_step

    @property
    def model_tflops_per_device(self) -> float:
        return self.model_flops_per_step / self.step_time_s / self.cluster.world_size / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation against the dense bf16/fp16 peak (fp8 plans too, so plans compare)."""
        dtype = "bf16" if self.plan.dtype in ("fp8", "bf16") else self.plan.dtype
        if not self.cluster.device.supports(dtype):
            dtype = "fp16"
        return self.model_tflops_per_device * 1e12 / self.cluster.device.peak_flops(dtype)

    @property
    def limit(self) -> MemoryLimit:
        """The memory limit and its make-up (usable memory, headroom, cap)."""
        if isinstance(self.memory_limit, MemoryLimit):
            return self.memory_limit
        limit = MemoryLimit.of(self.cluster.device)
        if self.memory_limit is None or abs(self.memory_limit - limit.gib) < 1e-9:
            return limit
        return MemoryLimit(limit.hbm_gib, limit.usable_gib, 1 - self.memory_limit / limit.usable_gib)

    @property
    def memory_limit_gib(self) -> float:
        return self.limit.gib

    @property
    def p_fit(self) -> float:
        """P(the true peak is within the limit) under the plan's class of out-of-sample
        memory residuals (:func:`partita.uncertainty.p_fit`)."""
        if self._p_fit is None or self._p_fit_limit != self.memory_limit_gib:  # the limit may be set later
            self._p_fit = unc.p_fit(self.peak_memory_gib, self.memory_limit_gib, self.memory_residuals)
            self._p_fit_limit = self.memory_limit_gib
        return self._p_fit

    @property
    def memory_residuals(self) -> unc.Residuals:
        return unc.memory_residuals(self.model, self.plan.seq_len, self.plan.dtype, self.cluster.device)

    @property
    def step_residuals(self) -> unc.Residuals:
        return unc.pick(unc.step_classes(self.model, self.plan, self.cluster.device), "step_time")

    @property
    def interval(self) -> dict[str, Any]:
        """80 % intervals of the step time and the peak (:func:`partita.uncertainty.interval`)."""
        return {"level": unc.LEVEL, "step_time_s": list(unc.interval(self.step_time_s, self.step_residuals)),
                "peak_memory_gib": list(unc.interval(self.peak_memory_gib, self.memory_residuals)),
                "classes": {"step_time": self.step_residuals.name, "peak_memory": self.memory_residuals.name}}

    @property
    def fits(self) -> bool:
        """The one meaning of "fits" (:mod:`partita.uncertainty`): not ruled out - P(fit) is at
        least ``min_p_fit``; the search keeps exactly these plans."""
        return self.p_fit >= self.min_p_fit

    @property
    def verdict(self) -> str:
        """"fits", "at risk" or "does not fit" (:func:`partita.uncertainty.verdict_kind`)."""
        return unc.verdict_kind(self.peak_memory_gib, self.memory_limit_gib, self.p_fit, self.min_p_fit)

    @property
    def headroom_gib(self) -> float:
        """Memory left under the limit at the peak (GiB); negative: how much it is over."""
        return self.memory_limit_gib - self.peak_memory_gib

    @property
    def memory_verdict(self) -> str:
        """One line saying whether the plan fits, as `partita estimate` prints it (:func:`memory_verdict`)."""
        where = f"pipeline rank {self.peak_rank.rank}" if self.plan.pp > 1 else "each device"
        rng = unc.interval(self.peak_memory_gib, self.memory_residuals)
        return unc.verdict(self.peak_memory_gib, self.limit, self.p_fit, where, self.min_p_fit, rng)

    def run_days(self, tokens: float) -> float:
        return tokens / self.plan.tokens_per_step * self.step_time_s / 86400

    def to_dict(self) -> dict[str, Any]:
        out = self._to_dict()
        if self.plan.finetune != "none" and getattr(self.model, "kind", "") != "traced":  # issue 36
            from .cost.finetune import frozen_params, trainable_params
            out["trainable_params"] = trainable_params(self.model, self.plan)
            out["frozen_params"] = frozen_params(self.model, self.plan)
        if self.cluster.device.collective_fits:  # a calibrated file: each time part's source (issue 22)
            out["time_sources"] = term_sources(self.cluster.device, self.time.parts)
        return out

    def _to_dict(self) -> dict[str, Any]:
        peak = self.peak_rank
        return {
            "model": self.model.name,
            "hardware": self.cluster.device.name,
            "devices": self.cluster.world_size,
            "devices_per_node": self.cluster.devices_per_node,
            "plan": self.plan.to_dict(),
            "step_time_s": self.step_time_s,
            "tokens_per_s_per_device": self.tokens_per_s_per_device,
            "model_tflops_per_device": self.model_tflops_per_device,
            "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_gib,
            "usable_memory_gib": self.cluster.device.usable_gib,
            "fits": self.fits,
            "verdict": self.verdict,
            "p_fit": self.p_fit,
            "min_p_fit": self.min_p_fit,
            "interval": self.interval,
            "memory_limit_gib": self.memory_limit_gib,
            "memory_limit": self.limit.describe(),
            "headroom_gib": self.headroom_gib,
            "memory_verdict": self.memory_verdict,
            "peak_memory_rank": peak.rank,
            "memory": {k: v / GIB for k, v in peak.parts.items()},
            "memory_per_stage_gib": [m.total / GIB for m in self.memory],
            "time": dict(self.time.parts),
            "stage_time_per_microbatch_s": [s.total for s in self.time.stages],
        }


def time_not_modelled(plan: Plan) -> list[tuple[str, str]]:
    """(Megatron flag, note) for each plan field whose memory the estimate prices but whose time
    it does not, so that every estimate of such a plan says so (not only one read from a script,
    whose importer names the flag): ``optimizer_offload`` (HybridDeviceOptimizer's host step and
    its device-host copies: cost/states.py prices only the device bytes). ``recompute_modules`` is
    priced in both: bytes (cost/activations.py) and the modules' recompute time
    (cost/compute.py ``module_recompute_forward``)."""
    notes = []
    if plan.optimizer_offload:
        notes.append(("--optimizer-cpu-offload", f"optimizer_offload={plan.optimizer_offload:g}: the optimizer step on "
                      "the host and its device-host copies take time the estimate does not count (the states' "
                      "memory is modelled)"))
    return notes


def estimate(model: ModelSpec, cluster: Cluster, plan: Plan) -> Estimate:
    """Predict per-rank memory and the step time of ``plan`` (validated first)."""
    if getattr(model, "kind", "") == "traced":  # a TracedSpec (partita.trace): its own terms
        return _estimate_traced(model, cluster, plan)
    plan = normalise(plan, model)  # with the model: an automatic layer split when layers do not divide
    check(plan, model, cluster.world_size)
    if plan.dtype != "fp32":
        cluster.device.peak_flops(plan.dtype)  # raises a clear error for e.g. fp8 on 910B
    return Estimate(model=model, cluster=cluster, plan=plan, time=estimate_step_time(model, cluster, plan))


def _estimate_traced(model: Any, cluster: Cluster, plan: Plan) -> Estimate:
    """:func:`estimate` of a traced model (:mod:`partita.cost.traced`): a sample is a sequence of length 1."""
    from .cost.traced import check_traced, traced_memory, traced_step_time
    plan = check_traced(model, plan.with_(seq_len=1), cluster.world_size)
    if plan.dtype != "fp32":
        cluster.device.peak_flops(plan.dtype)
    return Estimate(model=model, cluster=cluster, plan=plan, time=traced_step_time(model, cluster, plan),
                    _memory=traced_memory(model, cluster.device, plan))
