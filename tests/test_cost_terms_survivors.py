"""More cost terms pinned by hand, each added because a single-term break of
``src/partita/cost/`` survived every other planning test (``bench/mutate_cost_terms.py``,
issue 12). The expected figures are written out from the published formula or the
definition they come from and from the device file (hardware is data), never from the
cost model's own helpers. No torch import: these are planning tests.
"""
from __future__ import annotations

import dataclasses

import pytest

from partita.plan import Plan
from partita.spec.hardware import make_cluster

CLUSTER = make_cluster("h100-sxm", devices=8)
H100 = CLUSTER.device


def ring_all_reduce(device, size: float, n: int) -> float:
    """Ring all-reduce on one switched node: ``2 (n-1)/n S / B + 2 (n-1) alpha``
    [Thakur et al. 2005 sec. 4; nccl-tests PERFORMANCE.md], ``B`` = link GB/s x the
    achieved fraction from the device file."""
    if n <= 1 or size <= 0:
        return 0.0
    b = device.intra_gbps * 1e9 * device.efficiency.intra_node_comm
    return 2 * ((n - 1) / n * size / b + (n - 1) * device.intra_latency_us * 1e-6)


# --------------------------------------------------------------------------- memory limit
@pytest.mark.parametrize("cap", [10.0, 40.0])
def test_memory_cap_lowers_the_limit_by_hand(cap):
    """``--max-memory-gib`` caps what a plan may use: the limit is the device's usable
    memory (79.1 GiB for an H100 SXM in its device file) less the 5 % headroom, or the
    cap when that is lower - a cap can only ever lower the limit."""
    from partita.cost.memory import memory_limit_gib

    usable = H100.usable_gib * (1 - 0.05)
    assert usable > 70  # both caps are below it, so the cap must win
    assert memory_limit_gib(H100, 0.05, cap) == pytest.approx(cap, rel=1e-12)
    assert memory_limit_gib(H100, 0.05, 500.0) == pytest.approx(usable, rel=1e-12)
    assert memory_limit_gib(H100, 0.05) == pytest.approx(usable, rel=1e-12)


def test_search_reports_the_capped_memory_limit():
    """A search told ``max_memory_gib=12`` must plan against 12 GiB (not the 75 GiB an
    H100 offers with 5 % headroom), and every plan it keeps peaks within it."""
    from partita.search.engine import search_plans
    from partita.search.space import SearchSpace
    from partita.spec.load import load_model

    result = search_plans(load_model("tiny-llama"), CLUSTER, 8, 64, SearchSpace(max_memory_gib=12.0), top=3)
    assert result.memory_limit_gib == pytest.approx(12.0, rel=1e-12)
    assert result.plans and all(p.peak_memory_gib <= 12.0 for p in result.plans)


# --------------------------------------------------------------------------- pipeline
def test_pipeline_of_no_stages_takes_no_time():
    """``m max(t) + (sum(t) - max(t)) / v`` over no stages is an empty sum: 0 seconds."""
    from partita.cost.pipeline import pipeline_time

    assert pipeline_time([], 4, 1, "1f1b") == 0.0
    assert pipeline_time([2.0, 3.0], 4, 1, "1f1b") == pytest.approx(4 * 3.0 + 2.0)


# --------------------------------------------------------------------------- zero-0 MoE sync
#: tiny-moe by hand (h 64, 4 layers, q 64, k/v 32, o 64, 4 SwiGLU experts of 64, router
#: 4 x 64, one shared SwiGLU expert of 64, RMSNorm, vocab 256, untied): per layer
#: wq + wk + wv + wo = 4096 + 2048 + 2048 + 4096, two norms 128, router 256, routed
#: experts 4 x 3 x 64 x 64 = 49152, shared expert 3 x 64 x 64 = 12288; embedding and
#: output layer 256 x 64 each and the final norm 64.
TINY_MOE_EXPERT_PER_EXPERT = 3 * 64 * 64
TINY_MOE_DENSE = 4 * (12288 + 128 + 256 + 12288) + 2 * 256 * 64 + 64


@pytest.mark.parametrize("dp,ep", [(2, 1), (4, 2)])
@pytest.mark.parametrize("compression", ["none", "powersgd"])
def test_zero0_moe_gradient_all_reduce_by_hand(dp, ep, compression):
    """ZeRO-0 (DDP) all-reduces the fp32 gradients once per step, not overlapped here: the
    dense parameters over all of dp, each rank's routed experts (``4 / ep`` of them per
    layer) over the expert-data-parallel group of ``dp / ep`` ranks holding the same
    experts (Megatron-Core's expert data parallel; ring all-reduce, Thakur et al. 2005).
    PowerSGD only shrinks the bytes (its wire fraction) and adds its own GEMMs, so
    compressing must not change the ratio of what the two groups send."""
    from partita.cost.step import estimate_step_time
    from partita.spec.load import load_model

    model = load_model("tiny-moe")
    assert model.total_params() == TINY_MOE_DENSE + 4 * 4 * TINY_MOE_EXPERT_PER_EXPERT  # the hand count holds
    plan = Plan(dp=dp, ep=ep, zero=0, mbs=1, gbs=dp, seq_len=64, dtype="bf16", overlap_grad_reduce=False,
                grad_compression=compression, powersgd_rank=4)
    expert = 4 * (4 // ep) * TINY_MOE_EXPERT_PER_EXPERT
    sync = estimate_step_time(model, CLUSTER, plan).parts["dp gradient sync"]
    if compression == "none":
        want = ring_all_reduce(H100, 4 * TINY_MOE_DENSE, dp) + ring_all_reduce(H100, 4 * expert, dp // ep)
        assert sync == pytest.approx(want, rel=1e-9)
        return
    from partita.cost.compression import reduce_terms
    from partita.cost.memory import rank_shapes

    f, psgd = reduce_terms(model, H100, plan, TINY_MOE_DENSE + expert, rank_shapes(model, plan)[0])
    assert 0 < f < 1 and psgd > 0
    want = (ring_all_reduce(H100, f * 4 * TINY_MOE_DENSE, dp) + ring_all_reduce(H100, f * 4 * expert, dp // ep)
            + psgd)
    assert sync == pytest.approx(want, rel=1e-9)


# --------------------------------------------------------------------------- traced in bf16
@pytest.mark.parametrize("plan_dtype,scale", [("bf16", 1.0), ("fp32", 2.0)])
def test_traced_in_bf16_activation_bytes_by_hand(plan_dtype, scale):
    """A model traced in bf16 records 2-byte saved tensors: a bf16 plan keeps exactly the
    traced bytes, an fp32 plan twice them (4 / 2 bytes per element). One rank, no
    pipeline, the traced batch of 2: activations are every block's saved bytes plus
    those outside the blocks, once (one micro-batch in flight)."""
    from partita.cost.traced import traced_memory
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="block", params=1000, forward_flops=4e12, backward_flops=8e12, saved_bytes=4e8,
                        recompute_bytes=5e7, output_bytes=2e7, attention_forward_flops=1e12, matmuls=4)
    spec = TracedSpec(name="hand-bf16", batch=2, dtype="bf16", inputs=((2, 16),), total_params=4 * 1000 + 500,
                      forward_flops=4 * 4e12 + 2e11, backward_flops=4 * 8e12 + 4e11, saved_bytes=4 * 4e8 + 1e8,
                      block_class="Block", block_container="blocks", blocks=(block,) * 4, pipeline=True)
    plan = Plan(dp=1, zero=0, mbs=2, gbs=2, seq_len=1, dtype=plan_dtype)
    (rank,) = traced_memory(spec, H100, plan)
    assert rank.parts["activations"] == pytest.approx((4 * 4e8 + 1e8) * scale, rel=1e-12)


def test_traced_dtype_scale_applies_to_a_dataclass_copy():
    """The same spec re-labelled fp32 (4-byte saved tensors) halves a bf16 plan's bytes."""
    from partita.cost.traced import traced_memory
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="b", params=10, forward_flops=1e9, backward_flops=2e9, saved_bytes=1e6,
                        recompute_bytes=1e5, output_bytes=1e4, attention_forward_flops=0.0, matmuls=1)
    spec = TracedSpec(name="hand-dtype", batch=1, dtype="bf16", inputs=((1, 8),), total_params=10,
                      forward_flops=1e9, backward_flops=2e9, saved_bytes=1e6, block_class="B",
                      block_container="blocks", blocks=(block,), pipeline=True)
    plan = Plan(dp=1, zero=0, mbs=1, gbs=1, seq_len=1, dtype="bf16")
    bf16 = traced_memory(spec, H100, plan)[0].parts["activations"]
    fp32 = traced_memory(dataclasses.replace(spec, dtype="fp32"), H100, plan)[0].parts["activations"]
    assert bf16 == pytest.approx(1e6, rel=1e-12)
    assert fp32 == pytest.approx(0.5e6, rel=1e-12)


# --------------------------------------------------------------------------- GEMM time
def test_a_one_flop_gemm_takes_time_by_hand():
    """Any positive amount of work takes time: one FLOP as one bf16 GEMM runs at the peak x
    the GEMM efficiency x the size curve ``s / (s + s_half)`` for ``s`` = 1e-9 GFLOP (the
    saturating GEMM-size curve; figures from the device file)."""
    from partita.cost.compute import gemm_time

    s = 1e-9
    eff = H100.efficiency.gemm * s / (s + H100.efficiency.gemm_half_gflop)
    assert gemm_time(H100, 1.0, "bf16") == pytest.approx(1.0 / (H100.peak_tflops["bf16"] * 1e12 * eff), rel=1e-12)
    assert gemm_time(H100, 0.0, "bf16") == 0.0


# --------------------------------------------------------------------------- zero-0 autocast states
@pytest.mark.parametrize("framework,want", [("torchtitan", (4, 4, 8)), ("partita", (4, 4, 8)), ("megatron", (2, 4, 12))])
def test_zero0_model_states_by_framework_by_hand(framework, want):
    """bf16, zero 0: torchtitan without FSDP (torchtitan/distributed/utils.py
    maybe_enable_amp) and Partita's runtime train fp32 parameters under torch.autocast -
    fp32 weights (4 bytes), their fp32 ``.grad`` (4) and AdamW's m and v (8); Megatron's
    Float16Module keeps bf16 weights (2), fp32 main gradients (4) and the fp32 master copy
    with m and v (12) [Rajbhandari et al. 2020 sec. 3.1, 2 + 2 + 12 with fp32 gradients].
    Zero 1 shards the Adam state for every framework (autocast is a zero-0 setting)."""
    from partita.cost.memory import model_state_bytes

    w, g, o = want
    assert model_state_bytes(Plan(dp=2, zero=0, dtype="bf16", framework=framework), 1e9, 2) == {
        "weights": w * 1e9, "gradients": g * 1e9, "optimizer": o * 1e9}
    assert model_state_bytes(Plan(dp=2, zero=1, dtype="bf16", framework=framework), 1e9, 2) == {
        "weights": 2e9, "gradients": 4e9, "optimizer": 6e9}


def test_traced_zero0_under_partita_holds_autocast_states_by_hand():
    """A traced model run by Partita's runtime at zero 0 in bf16 holds fp32 parameters under
    autocast: 4 + 4 + 8 bytes for each of its 4 x 1000 + 500 parameters."""
    from partita.cost.traced import traced_memory
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="block", params=1000, forward_flops=4e12, backward_flops=8e12, saved_bytes=4e8,
                        recompute_bytes=5e7, output_bytes=2e7, attention_forward_flops=1e12, matmuls=4)
    spec = TracedSpec(name="hand-autocast", batch=2, dtype="fp32", inputs=((2, 16),), total_params=4500,
                      forward_flops=4 * 4e12 + 2e11, backward_flops=4 * 8e12 + 4e11, saved_bytes=4 * 4e8 + 1e8,
                      block_class="Block", block_container="blocks", blocks=(block,) * 4, pipeline=True)
    plan = Plan(dp=2, zero=0, mbs=2, gbs=4, seq_len=1, dtype="bf16", framework="partita")
    (rank,) = traced_memory(spec, H100, plan)
    assert (rank.parts["weights"], rank.parts["gradients"], rank.parts["optimizer"]) == pytest.approx(
        (4 * 4500, 4 * 4500, 8 * 4500), rel=1e-12)


# --------------------------------------------------------------------------- traced GEMM counts
@pytest.mark.parametrize("matmuls", [0, 1])
def test_traced_block_with_one_or_no_matmul_by_hand(matmuls):
    """A traced block's GEMM FLOPs are timed as ``matmuls`` equal GEMMs forward and
    ``3 x matmuls`` forward + backward (dgrad and wgrad per forward GEMM), at least one, on
    the saturating GEMM-size curve; plus 3 HBM passes over the saved bytes (one forward)
    and the launch overhead once forward, three times in all. One block of 1 TFLOP forward
    and 2 backward, no attention, nothing outside the blocks, micro-batch = traced batch."""
    from partita.cost.traced import traced_step_time
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="b", params=10, forward_flops=1e12, backward_flops=2e12, saved_bytes=1e6,
                        recompute_bytes=1e5, output_bytes=1e4, attention_forward_flops=0.0, matmuls=matmuls)
    spec = TracedSpec(name=f"hand-mm{matmuls}", batch=1, dtype="bf16", inputs=((1, 8),), total_params=10,
                      forward_flops=1e12, backward_flops=2e12, saved_bytes=1e6, block_class="B",
                      block_container="blocks", blocks=(block,), pipeline=True)
    st = traced_step_time(spec, CLUSTER, Plan(dp=1, zero=0, mbs=1, gbs=1, seq_len=1, dtype="bf16"))
    (stage,) = st.stages

    def gemm(flops: float, count: int) -> float:
        s = flops / count / 1e9
        return flops / (H100.peak_tflops["bf16"] * 1e12 * H100.efficiency.gemm * s / (s + H100.efficiency.gemm_half_gflop))

    hbm = 3 * 1e6 / (H100.hbm_tbps * 1e12 * H100.efficiency.memory_bandwidth)
    ov = H100.efficiency.kernel_overhead_us_per_layer * 1e-6
    assert stage.forward == pytest.approx(gemm(1e12, 1) + hbm / 3 + ov, rel=1e-12)
    assert stage.parts["compute"] == pytest.approx(gemm(3e12, max(1, 3 * matmuls)) + hbm + 3 * ov, rel=1e-12)


# --------------------------------------------------------------------------- fp8 casts of MLA
def test_fp8_casts_per_token_of_an_mla_layer_by_hand():
    """torchao Float8Linear casts each linear's input. A DeepSeek-V3 dense layer (h 7168,
    MLA: q down h -> 1536, q up 1536 -> 128 x 192, kv down h -> 512 + 64, kv up 512 -> 128 x
    256, wo 128 x 128 -> h; SwiGLU MLP of 18432), tp 1, per token: the four MLA projections
    read ``h + 1536 + h + 512``, wo its 16384 inputs, w1 and w3 ``x`` (2h), w2 its 18432.
    Weights cancel in the difference of two token counts."""
    from partita.cost.compute import fp8_cast_elements
    from partita.cost.shape import LayerShape
    from partita.spec.load import load_model

    model, h = load_model("deepseek-v3"), 7168
    shape = LayerShape(tp=1, cp=1, ep=1, mbs=1, seq_len=4096, sp=False, dtype="fp8", framework="torchtitan")
    per_token = (fp8_cast_elements(model, shape._replace(mbs=2), False) - fp8_cast_elements(model, shape, False)) / 4096
    rest = 128 * 128 + 2 * h + 18432
    assert per_token == pytest.approx((h + 1536 + h + 512) + rest, rel=1e-12)


# --------------------------------------------------------------------------- eager MoE element-wise
def test_unfused_elementwise_bytes_of_a_moe_layer_by_hand():
    """Eager torchtitan (no compile) on tiny-moe (h 64, q 64, k/v 32, RoPE, 4 SwiGLU experts
    of 64 with top-2, one shared SwiGLU expert of 64), bf16, tp 1, 2 x 32 tokens. Per token
    beyond the fused count: 2 RMSNorms x 32 B x 64; RoPE 16 B x (64 + 32); repeat_kv reads
    2 x 32 and writes 2 x 64 elements of 2 B; SwiGLU's separate silu and multiply 2 x 2 B on
    the width the token's experts run: 2 routed copies x 64 + 1 shared x 64 (the op
    sequences cited in frameworks.unfused_elementwise_bytes)."""
    from partita.cost.frameworks import unfused_elementwise_bytes
    from partita.cost.shape import LayerShape
    from partita.spec.load import load_model

    model = load_model("tiny-moe")
    shape = LayerShape(tp=1, cp=1, ep=1, mbs=2, seq_len=32, sp=False, dtype="bf16", framework="torchtitan-eager")
    per_token = 2 * 32 * 64 + 16 * (64 + 32) + 2 * (32 + 64) * 2 + 2 * 2 * (2 * 64 + 1 * 64)
    assert unfused_elementwise_bytes(model, shape, True, 2) == pytest.approx(64 * per_token, rel=1e-12)


# --------------------------------------------------------------------------- zero-2 sharded accumulation
def test_zero2_reduce_scatter_per_micro_batch_exposure_by_hand():
    """ZeRO-2 with sharded accumulation reduce-scatters every micro-batch's gradients into
    the shard (Megatron's distributed optimizer / FSDP2 zero 2 without no_sync). A wide
    2-layer model on 8 tokens per micro-batch (Llama-3-8B-like layers), dp 8 on one node, 4 micro-batches, fp32 gradients: each reduce-scatter is a ring over 8
    of ``4 P`` bytes [Thakur et al. 2005]. Overlapped, each of the first ``m - 1 = 3`` hides
    behind its backward and the next forward, exposing ``max(0, t_rs - bwd - fwd)``; the
    last hides only behind its own backward, exposing ``max(t_rs / L, t_rs - bwd)`` (one
    layer's share is never hidden); the bf16 parameter all-gather after the step (not
    overlapped here) is a ring all-gather of ``2 P`` bytes. The model is comm-bound enough
    that the per-micro-batch term is positive, so it counts."""
    from partita.cost.step import estimate_step_time
    from partita.spec.model import ModelSpec

    model = ModelSpec(name="wide-hand", hidden=4096, layers=2, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000)
    p = model.total_params()
    plan = Plan(dp=8, zero=2, mbs=1, gbs=32, seq_len=8, dtype="bf16", overlap_grad_reduce=True,
                overlap_param_gather=False)
    st = estimate_step_time(model, CLUSTER, plan)
    (stage,) = st.stages
    b = H100.intra_gbps * 1e9 * H100.efficiency.intra_node_comm
    alpha = H100.intra_latency_us * 1e-6
    t_rs = 7 / 8 * 4 * p / b + 7 * alpha
    t_ag = 7 / 8 * 2 * p / b + 7 * alpha
    per_mb = t_rs - stage.backward - stage.forward
    assert per_mb > 0
    want = max(t_rs / model.layers, t_rs - stage.backward) + 3 * per_mb + t_ag
    assert st.parts["dp gradient sync"] == pytest.approx(want, rel=1e-9)


def test_fp8_casts_of_a_moe_layer_under_tensor_parallel_by_hand():
    """torchao Float8Linear casts each linear's input and weight per forward. tiny-moe (h 64,
    q 64, k/v 32, o 64; 4 SwiGLU experts of 64, top-2; 1 shared SwiGLU expert of 64), tp 2,
    ep 1, etp 1 (Megatron-Core MoE parallel folding: experts not split by tp), 2 x 32 tokens,
    linear by linear per token on one tp rank: wq, wk, wv read x (64 each), wo its 64 / 2
    inputs; the rank's tokens / 2 routed copies (top-2) go through w1 and w3 (64 each) and w2
    (64): 2 x 192 / 2; the shared expert is column/row parallel: w1, w3 read x (64 each), w2
    its 64 / 2. Weights: (q, k, v, o) / 2, all 4 experts' 3 x 64 x 64 and half of the shared
    expert's. (A rowwise recipe: torchtitan's regular TP; tensorwise casts the attention input
    before the tp all-gather, tests/test_cost_fp8_tp_gather.py.)"""
    from partita.cost.compute import fp8_cast_elements
    from partita.cost.shape import LayerShape
    from partita.spec.load import load_model

    model = load_model("tiny-moe")
    shape = LayerShape(tp=2, cp=1, ep=1, mbs=2, seq_len=32, sp=True, dtype="fp8", framework="torchtitan", etp=1,
                       fp8_recipe="rowwise")
    per_token = (3 * 64 + 64 / 2) + 2 * (64 + 64 + 64) / 2 + (64 + 64 + 64 / 2)
    weights = (64 * 64 + 2 * 32 * 64 + 64 * 64) / 2 + 3 * 64 * 64 * 4 + 3 * 64 * 64 / 2
    assert fp8_cast_elements(model, shape, True) == pytest.approx(64 * per_token + weights, rel=1e-12)


# --------------------------------------------------------------------------- traced refusals
@pytest.mark.parametrize("knob", [{"ep": 2}, {"ep": 4}, {"cp": 2}, {"sp": True, "tp": 2}])
def test_traced_model_refuses_expert_context_and_sequence_parallel(knob):
    """A traced model has no transformer layer structure to split experts, the sequence or
    its norms over, so any ep, cp > 1 or sp is refused with the reason (and dp alone is not)."""
    from partita.cost.traced import traced_problems
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="b", params=10, forward_flops=1e9, backward_flops=2e9, saved_bytes=1e6,
                        recompute_bytes=1e5, output_bytes=1e4, attention_forward_flops=0.0, matmuls=1)
    spec = TracedSpec(name="hand-refuse", batch=1, dtype="bf16", inputs=((1, 8),), total_params=10,
                      forward_flops=1e9, backward_flops=2e9, saved_bytes=1e6, block_class="B",
                      block_container="blocks", blocks=(block,), pipeline=True)
    reason = "context/expert/sequence parallel need a transformer spec"
    base = dict(dp=4, mbs=1, gbs=4, seq_len=8)
    assert not any(reason in p for p in traced_problems(spec, Plan(**base)))
    assert any(reason in p for p in traced_problems(spec, Plan(**{**base, **knob})))


@pytest.mark.parametrize("n,pp,want", [(5, 2, [3, 2]), (7, 3, [3, 2, 2]), (4, 2, [2, 2])])
def test_traced_stage_blocks_split_unevenly_by_hand(n, pp, want):
    """A balanced pipeline split of ``n`` traced blocks over ``pp`` stages: every block in
    exactly one stage, in order, the first ``n mod pp`` stages one block more."""
    from partita.cost.traced import stage_blocks
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="b", params=10, forward_flops=1e9, backward_flops=2e9, saved_bytes=1e6,
                        recompute_bytes=1e5, output_bytes=1e4, attention_forward_flops=0.0, matmuls=1)
    spec = TracedSpec(name="hand-split", batch=1, dtype="bf16", inputs=((1, 8),), total_params=10 * n,
                      forward_flops=1e9 * n, backward_flops=2e9 * n, saved_bytes=1e6 * n, block_class="B",
                      block_container="blocks", blocks=(block,) * n, pipeline=True)
    stages = stage_blocks(spec, Plan(pp=pp, mbs=1, gbs=pp, seq_len=8))
    assert [len(s) for s in stages] == want
    assert [i for s in stages for i in s] == list(range(n))


def _one_heavy_block(p: float, name: str):
    """A traced model of one ``p``-parameter block with little compute (traffic > backward)."""
    from partita.spec.traced import TracedBlock, TracedSpec

    block = TracedBlock(name="b", params=p, forward_flops=1e10, backward_flops=2e10, saved_bytes=1e6,
                        recompute_bytes=1e5, output_bytes=1e4, attention_forward_flops=0.0, matmuls=2)
    return TracedSpec(name=name, batch=1, dtype="bf16", inputs=((1, 8),), total_params=p,
                      forward_flops=1e10, backward_flops=2e10, saved_bytes=1e6, block_class="B",
                      block_container="blocks", blocks=(block,), pipeline=True)


def test_traced_zero3_overlap_window_is_every_micro_batch_backward_by_hand():
    """Traced ZeRO-3 (FSDP2) on dp 8, 4 micro-batches, overlapped: every micro-batch
    all-gathers the bf16 parameters twice (forward, backward) and reduce-scatters the fp32
    gradients once - ring collectives over 8 [Thakur et al. 2005] - and each micro-batch's
    traffic hides behind its own backward, so the exposed part is ``m (t_mb - bwd)`` when
    the traffic exceeds the backward (a 4e8-parameter block with little compute)."""
    from partita.cost.traced import traced_step_time

    p = 4e8
    spec = _one_heavy_block(p, "hand-z3")
    st = traced_step_time(spec, CLUSTER, Plan(dp=8, zero=3, mbs=1, gbs=32, seq_len=8, dtype="bf16"))
    (stage,) = st.stages
    b = H100.intra_gbps * 1e9 * H100.efficiency.intra_node_comm
    alpha = H100.intra_latency_us * 1e-6
    per_mb = 2 * (7 / 8 * 2 * p / b + 7 * alpha) + (7 / 8 * 4 * p / b + 7 * alpha)
    assert per_mb > stage.backward
    assert st.parts["dp gradient sync (exposed)"] == pytest.approx(4 * (per_mb - stage.backward), rel=1e-9)


def test_traced_zero1_overlap_window_is_one_backward_by_hand():
    """Traced ZeRO-1 on dp 8, overlapped: once per step the fp32 gradients are
    reduce-scattered and the bf16 parameters all-gathered (rings over 8), hidden behind one
    micro-batch's backward (the last), so ``t_rs + t_ag - bwd`` is exposed."""
    from partita.cost.traced import traced_step_time

    p = 4e8
    spec = _one_heavy_block(p, "hand-z1")
    st = traced_step_time(spec, CLUSTER, Plan(dp=8, zero=1, mbs=1, gbs=32, seq_len=8, dtype="bf16"))
    (stage,) = st.stages
    b = H100.intra_gbps * 1e9 * H100.efficiency.intra_node_comm
    alpha = H100.intra_latency_us * 1e-6
    sync = (7 / 8 * 4 * p / b + 7 * alpha) + (7 / 8 * 2 * p / b + 7 * alpha)
    assert sync > 2 * stage.backward
    assert st.parts["dp gradient sync (exposed)"] == pytest.approx(sync - stage.backward, rel=1e-9)
