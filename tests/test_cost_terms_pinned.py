"""Cost terms pinned by hand derivations that do not call the cost model's own helpers
(issue 12: breaking any single term of ``src/partita/cost/`` must fail a planning test).

Each test builds a small case, writes the expected figure out from the published
formula it comes from - ring collectives (Thakur et al. 2005 sec. 4; nccl-tests
PERFORMANCE.md), ZeRO model-state bytes (Rajbhandari et al. 2020 sec. 5), 1F1B pipeline
fill/drain (Narayanan et al. SC'21 sec. 2.2, eq. 1), activation checkpointing (Chen et al.
2016), the saturating GEMM-size efficiency curve and the device's datasheet figures (hardware
is data: the figures are read from the device file, never from the cost model) - and
compares. These tests never import torch: ``bench/mutate_cost_terms.py`` runs them as
planning tests, and each was added because a single-term break survived the others.
"""
from __future__ import annotations

import pytest

from partita.cost.traced import traced_memory, traced_step_time
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.traced import TracedBlock, TracedSpec

CLUSTER = make_cluster("h100-sxm", devices=8)
H100 = CLUSTER.device
GIB = 2 ** 30


# --------------------------------------------------------------------------- hand formulas
def ring(device, kind: str, size: float, n: int) -> float:
    """One-node ring collective on a switch (every member drives the full link): all-reduce
    ``2(n-1)/n S / B + 2(n-1) alpha``, all-gather / reduce-scatter ``(n-1)/n S / B +
    (n-1) alpha`` [Thakur et al. 2005 sec. 4]; ``B`` = link GB/s x achieved fraction."""
    if n <= 1 or size <= 0:
        return 0.0
    b = device.intra_gbps * 1e9 * device.efficiency.intra_node_comm
    alpha = device.intra_latency_us * 1e-6
    factor = 2 if kind == "all_reduce" else 1
    return factor * ((n - 1) / n * size / b + (n - 1) * alpha)


def p2p(device, size: float) -> float:
    """Point-to-point inside a node: ``S / B + alpha``."""
    return size / (device.intra_gbps * 1e9 * device.efficiency.intra_node_comm) + device.intra_latency_us * 1e-6


def gemm_seconds(device, flops: float, count: int) -> float:
    """``count`` equal bf16 GEMMs: peak x efficiency x ``s / (s + s_half)`` for GEMMs of
    ``s`` GFLOP each (the saturating size curve, device file ``gemm_half_gflop``)."""
    if flops <= 0:
        return 0.0
    s = flops / count / 1e9
    eff = device.efficiency.gemm * s / (s + device.efficiency.gemm_half_gflop)
    return flops / (device.peak_tflops["bf16"] * 1e12 * eff)


def attention_seconds(device, flops: float) -> float:
    return flops / (device.peak_tflops["bf16"] * 1e12 * device.efficiency.attention)


def hbm_seconds(device, nbytes: float) -> float:
    return nbytes / (device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth)


#: Adam step HBM traffic per local parameter: read fp32 grad, master, m, v (16), write
#: master, m, v (12) and the bf16 copy (2), zero the grad (4) [fused Adam, HBM-bound].
ADAM_BYTES = 34


# --------------------------------------------------------------------------- traced models
#: A traced model built by hand: 4 equal blocks + 500 parameters outside (stem, head),
#: traced in fp32 with a batch of 2. Each block: 1000 parameters of which 600 split by tp;
#: 4 TFLOP forward (3 of them in the tp-split layers, 1 in fused attention), 8 backward.
BLOCK = TracedBlock(name="block", params=1000, forward_flops=4e12, backward_flops=8e12, saved_bytes=4e8,
                    recompute_bytes=5e7, output_bytes=2e7, attention_forward_flops=1e12, matmuls=4,
                    tp_params=600, tp_forward_flops=3e12, tp_saved_bytes=3e8, tp_allreduce_bytes=1e7)
SPEC = TracedSpec(name="hand", batch=2, dtype="fp32", inputs=((2, 16),), total_params=4 * 1000 + 500,
                  forward_flops=4 * 4e12 + 2e11, backward_flops=4 * 8e12 + 4e11, saved_bytes=4 * 4e8 + 1e8,
                  block_class="Block", block_container="blocks", blocks=(BLOCK,) * 4, pipeline=True,
                  tp_plan=(("attn.w", "colwise"),), modules=(("stem", 300, 1e11), ("head", 200, 1e11)))


def test_traced_memory_by_hand_tp_pp_zero1():
    """dp 2 x tp 2 x pp 2, ZeRO-1, bf16 plan of an fp32 trace, micro-batch 4 of the traced 2.

    Per rank, a block keeps ``1000 - 600 + 600/2 = 700`` parameters; rank 0 also the 500
    outside the blocks. Model states with fp32 gradients and the Adam state sharded over
    dp (Megatron distributed optimizer: ``2 + 4 + 12/d`` bytes per parameter).
    Activations: a block saves ``4e8 - 3e8 + 3e8/2 = 2.5e8`` bytes per traced batch, x 2
    (micro-batch over traced batch) x 1/2 (bf16 over fp32); rank 0 adds the 1e8 outside;
    1F1B rank ``i`` of ``p`` holds ``min(m, p - i)`` micro-batches (m = 32 / (2 x 4) = 4)."""
    plan = Plan(dp=2, tp=2, pp=2, zero=1, mbs=4, gbs=32, seq_len=1, dtype="bf16")
    mem = traced_memory(SPEC, H100, plan)
    for rank, params, act in ((0, 2 * 700 + 500, (2 * 2.5e8 + 1e8) * 2), (1, 2 * 700, 2 * 2.5e8 * 1)):
        parts = mem[rank].parts
        assert parts["weights"] == pytest.approx(2 * params)
        assert parts["gradients"] == pytest.approx(4 * params)
        assert parts["optimizer"] == pytest.approx(12 * params / 2)
        assert parts["activations"] == pytest.approx(act)
        allocated = 2 * params + 4 * params + 6 * params + act
        assert parts["allocator fragmentation"] == pytest.approx(allocated * H100.allocator_fragmentation)
        assert mem[rank].total == pytest.approx(allocated * (1 + H100.allocator_fragmentation)
                                                + H100.runtime_reserved_gib * GIB)


def test_traced_memory_by_hand_full_recompute_and_zero3():
    """Full recompute keeps each block's input (5e7 bytes per traced batch, x 4/2 for the
    micro-batch, x 1/2 for bf16; plus the 1e8 outside the blocks) and one block's whole
    saved set while it is recomputed [Chen et al. 2016]; ZeRO-3 over dp 4: ``16 / 4`` bytes per parameter of model states
    [Rajbhandari et al. 2020, 16 Psi / N_d] plus the gathered bf16 unit being run and the
    one prefetched (``2 x 1000 x 2`` bytes)."""
    plan = Plan(dp=4, zero=3, mbs=4, gbs=16, seq_len=1, dtype="bf16", recompute="full")
    (rank,) = traced_memory(SPEC, H100, plan)
    parts = rank.parts
    params = 4500
    assert parts["weights"] + parts["gradients"] + parts["optimizer"] == pytest.approx(16 * params / 4)
    assert parts["zero3 gathered units"] == pytest.approx(2 * 1000 * 2)
    work, scale = 4 / 2, 2 / 4
    assert parts["activations"] == pytest.approx((4 * 5e7 + 1e8) * work * scale * 1)
    assert parts["recompute working set"] == pytest.approx(4e8 * work * scale)


def test_traced_zero3_gathers_the_tp_shard_of_a_block_by_hand():
    """With tp 2 and ZeRO-3 over dp 2 a rank all-gathers its own tp shard of each block over
    dp: ``1000 - 600 + 600/2 = 700`` parameters, bf16, the unit being run and the one
    prefetched (``2 x 700 x 2`` bytes) - FSDP2 shards each tp DTensor's local shard."""
    plan = Plan(dp=2, tp=2, zero=3, mbs=2, gbs=8, seq_len=1, dtype="bf16")
    (rank,) = traced_memory(SPEC, H100, plan)
    assert rank.parts["zero3 gathered units"] == pytest.approx(2 * 700 * 2)


def _block_seconds(local: float, work: float, tp: int) -> tuple[float, float]:
    """(forward + backward, forward) seconds of one hand block: its GEMM FLOPs at the
    size curve (4 GEMMs forward, 12 forward + backward), fused attention at the attention
    efficiency with a 2.5x backward (FlashAttention-2 sec. 4.1), 3 HBM passes over the
    saved bytes, the per-layer launch overhead once forward and twice backward."""
    attn = 1e12 * local
    train = gemm_seconds(H100, 12e12 * local - 3.5 * attn, 12) + attention_seconds(H100, 3.5 * attn)
    fwd = gemm_seconds(H100, 4e12 * local - attn, 4) + attention_seconds(H100, attn)
    ew = 3 * hbm_seconds(H100, (4e8 - 3e8 + 3e8 / tp) * work * 0.5)
    ov = H100.efficiency.kernel_overhead_us_per_layer * 1e-6
    return train + ew + 3 * ov, fwd + ew / 3 + ov


def test_traced_step_time_by_hand_tp_pp_zero1():
    """dp 2 x tp 2 x pp 2, ZeRO-1, m = 4. tp splits 3/4 of a block's FLOPs: local work
    ``(1/4 + 3/4 / 2) x 2`` traced batches. Rank 0 adds the outside FLOPs (6 GEMMs
    forward + backward, 2 forward). Each rank all-reduces its blocks' 1e7 bytes twice
    (forward, backward) in a tp pair; sends its output (2e7 x 2 x 1/2) each way; the
    step is ``m t_max + (t_0 + t_1 - t_max)`` (1F1B, Narayanan et al. eq. 1) plus the
    exposed ZeRO-1 reduce-scatter (fp32 grads) + all-gather (bf16) of the slower rank's
    parameters beyond its backward, plus Adam's HBM traffic on its half of them."""
    plan = Plan(dp=2, tp=2, pp=2, zero=1, mbs=4, gbs=32, seq_len=1, dtype="bf16")
    work = 2.0
    local = (0.25 + 0.75 / 2) * work
    train, fwd = _block_seconds(local, work, 2)
    other = 6e11 * work
    compute = [2 * train + gemm_seconds(H100, other, 6), 2 * train]
    forward = [2 * fwd + gemm_seconds(H100, 2e11 * work, 2), 2 * fwd]
    tp_ar = 2 * ring(H100, "all_reduce", 2 * 1e7 * work * 0.5, 2)
    send = 2 * p2p(H100, 2e7 * work * 0.5)
    totals = [c + tp_ar + send for c in compute]
    st = traced_step_time(SPEC, CLUSTER, plan)
    for r in (0, 1):
        assert st.stages[r].parts["compute"] == pytest.approx(compute[r], rel=1e-9)
        assert st.stages[r].parts["tp all-reduce"] == pytest.approx(tp_ar, rel=1e-9)
        assert st.stages[r].parts["pp send/recv"] == pytest.approx(send, rel=1e-9)
        assert st.stages[r].forward == pytest.approx(forward[r], rel=1e-9)
        assert st.stages[r].backward == pytest.approx(compute[r] - forward[r], rel=1e-9)
        assert st.stages[r].flops == pytest.approx(2 * 12e12 * local + (other if r == 0 else 0.0), rel=1e-9)
    pipe = 4 * max(totals) + min(totals)
    params = 2 * 700 + 500  # rank 0 is the slower one (it runs the stem and head too)
    sync = ring(H100, "reduce_scatter", 4 * params, 2) + ring(H100, "all_gather", 2 * params, 2)
    exposed = max(0.0, sync - (compute[0] - forward[0]))
    adam = hbm_seconds(H100, ADAM_BYTES * params / 2)
    assert st.parts["pipeline bubble"] == pytest.approx(pipe - 4 * totals[0], rel=1e-9)
    assert st.parts["optimizer step"] == pytest.approx(adam, rel=1e-9)
    assert st.step == pytest.approx(pipe + exposed + adam, rel=1e-9)


def test_traced_full_recompute_step_by_hand():
    """Full recompute reruns each block's forward once more in the backward [Chen et al.
    2016]: its forward GEMMs and attention plus one element-wise pass over the saved
    bytes (a third of the three) and the launch overhead. dp 8, one stage, micro-batch 4
    of the traced 2: the stage's backward is its train time less the forward plus that
    rerun, and the step ``m = 2`` stage times plus the (not overlapped) sync and Adam."""
    plan = Plan(dp=8, zero=1, mbs=4, gbs=64, seq_len=1, dtype="bf16", recompute="full", overlap_grad_reduce=False)
    work = 2.0
    train, fwd = _block_seconds(work, work, 1)
    st = traced_step_time(SPEC, CLUSTER, plan)
    (stage,) = st.stages
    other = 6e11 * work
    compute = 4 * train + gemm_seconds(H100, other, 6)
    forward = 4 * fwd + gemm_seconds(H100, 2e11 * work, 2)
    assert stage.parts["recompute"] == pytest.approx(4 * fwd, rel=1e-9)
    assert stage.parts["compute"] == pytest.approx(compute, rel=1e-9)
    assert stage.backward == pytest.approx(compute - forward + 4 * fwd, rel=1e-9)
    sync = ring(H100, "reduce_scatter", 4 * 4500, 8) + ring(H100, "all_gather", 2 * 4500, 8)
    adam = hbm_seconds(H100, ADAM_BYTES * 4500 / 8)
    m = 64 // (8 * 4)
    assert st.step == pytest.approx(m * (compute + 4 * fwd) + sync + adam, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_traced_dp_sync_by_hand(zero):
    """dp 8 on one node, no overlap: ZeRO-0 all-reduces the fp32 gradients once per step;
    ZeRO-1 and 2 reduce-scatter them and all-gather the updated bf16 parameters once per step;
    ZeRO-3 (FSDP) gathers the bf16 parameters twice per micro-batch (forward, backward) and
    reduce-scatters the gradients once per micro-batch (m = 64 / (8 x 2) = 4)."""
    plan = Plan(dp=8, zero=zero, mbs=2, gbs=64, seq_len=1, dtype="bf16", overlap_grad_reduce=False)
    st = traced_step_time(SPEC, CLUSTER, plan)
    p = 4500
    if zero == 0:
        sync = ring(H100, "all_reduce", 4 * p, 8)
    elif zero in (1, 2):
        sync = ring(H100, "reduce_scatter", 4 * p, 8) + ring(H100, "all_gather", 2 * p, 8)
    else:
        sync = 4 * (2 * ring(H100, "all_gather", 2 * p, 8) + ring(H100, "reduce_scatter", 4 * p, 8))
    assert st.parts["dp gradient sync (exposed)"] == pytest.approx(sync, rel=1e-9)
    assert st.parts["optimizer step"] == pytest.approx(hbm_seconds(H100, ADAM_BYTES * p / (8 if zero else 1)), rel=1e-9)
    (stage,) = st.stages
    assert st.step == pytest.approx(4 * stage.total + sync + st.parts["optimizer step"], rel=1e-9)


def test_traced_pipeline_send_across_nodes_by_hand():
    """dp 8 x pp 2 on two 8-device nodes: pp is the outermost mesh axis, so stage 0's rank
    r and stage 1's rank r + 8 sit on different nodes and the activation send crosses the
    network: ``S / B_inter + alpha_inter`` each way (NIC line rate x achieved fraction)."""
    cluster = make_cluster("h100-sxm", devices=16)
    dev = cluster.device
    st = traced_step_time(SPEC, cluster, Plan(dp=8, pp=2, zero=1, mbs=2, gbs=64, seq_len=1, dtype="bf16"))
    size = 2e7 * (2 / 2) * 0.5
    one_way = size / (dev.inter_gbps * 1e9 * dev.efficiency.inter_node_comm) + dev.inter_latency_us * 1e-6
    assert st.stages[0].parts["pp send/recv"] == pytest.approx(2 * one_way, rel=1e-9)


# --------------------------------------------------------------------------- fitted collectives
@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_fitted_collective_across_nodes_is_hierarchical_by_hand(kind):
    """A calibrated device (per-collective alpha-beta fit, measured inside one node) on a
    group of 8 per node x 4 nodes: the node-local part is the fitted ring on 8 ranks
    [Thakur et al. 2005 sec. 4: all-reduce ``2(n-1) alpha + 2(n-1)/n S / B``, all-gather /
    reduce-scatter half], the network part keeps the datasheet model on the ``S / g`` each
    node exchanges: ``f (k-1)/k (S/g) / B_inter`` and ``f ceil(log2 k)`` network latencies
    (``f`` = 2 for an all-reduce, 1 otherwise; hardware.md sec. 3.3)."""
    import dataclasses

    from partita.cost import comm
    from partita.spec.collective_fits import CollectiveFit

    alpha, bw = 7e-6, 2.2e11
    dev = dataclasses.replace(H100, collective_fits=(CollectiveFit(kind, 8, alpha, bw),))
    f = 2 if kind == "all_reduce" else 1
    size, g, k = 3e9, 8, 4
    intra = f * (g - 1) * alpha + f * (g - 1) / g * size / bw
    inter = f * (k - 1) / k * (size / g) / (dev.inter_gbps * 1e9 * dev.efficiency.inter_node_comm)
    lat = f * 2 * dev.inter_latency_us * 1e-6  # ceil(log2 4) = 2 steps
    assert getattr(comm, kind)(dev, size, g, k) == pytest.approx(intra + inter + lat, rel=1e-12)


# --------------------------------------------------------------------------- PowerSGD work
def _powersgd_by_hand(model, rank: int) -> tuple[float, float, float]:
    """(elements sent, elements compressed, FLOPs) of one dp=2 tp=1 rank of ``model`` under
    PowerSGD rank ``rank`` [Vogels et al. 2019, Alg. 1; torch's powerSGD_hook]: every
    ``n x m`` weight gradient with ``2 r (n + m) < n m`` (torch's ``_should_compress``) is
    sent as its factors ``P (n x r)``, ``Q (m x r)``; the rest whole. Per compressed matrix:
    ``P = M Q`` and ``Q = M^T P`` (``2 n m r`` FLOPs each) and the Gram-Schmidt
    orthogonalisation of ``P`` (``2 n r^2``)."""
    h, q, kv, o, f, v = model.hidden, model.q_dim, model.kv_dim, model.attn_out_dim, model.ffn_hidden, model.vocab
    layer = [(q, h), (kv, h), (kv, h), (h, o), (f, h), (f, h), (h, f)]
    mats = layer * model.layers + [(v, h), (v, h)]  # + embedding and the untied output layer
    sent = compressed = flops = 0.0
    for n, m in mats:
        r = min(n, m, rank)
        if 2 * r * (n + m) < n * m:
            sent += r * (n + m)
            compressed += n * m
            flops += 4 * n * m * r + 2 * n * r * r
    rest = model.total_params() - compressed
    return sent + rest, compressed, flops


@pytest.mark.parametrize("fp32_tflops", [67.0, 0.05])
def test_powersgd_work_by_hand(fp32_tflops):
    """PowerSGD's own seconds per step: the larger of its GEMM FLOPs at the fp32 peak x
    the GEMM efficiency and 5 passes over the compressed fp32 gradients at the achieved HBM
    bandwidth (skinny rank-r GEMMs are memory-bound). H100's datasheet fp32 peak makes the
    memory passes bind; a device with a 50 GFLOP/s fp32 peak makes the FLOPs bind."""
    import dataclasses

    from partita.cost.compression import reduce_terms
    from partita.cost.memory import rank_shapes
    from partita.spec.load import load_model

    model = load_model("tiny-llama")
    dev = dataclasses.replace(H100, peak_tflops={**H100.peak_tflops, "fp32": fp32_tflops})
    plan = Plan(dp=2, zero=0, mbs=1, gbs=2, seq_len=64, dtype="fp32", grad_compression="powersgd", powersgd_rank=4)
    sent, compressed, flops = _powersgd_by_hand(model, 4)
    fraction, seconds = reduce_terms(model, dev, plan, model.total_params(), rank_shapes(model, plan)[0])
    assert fraction == pytest.approx(sent / model.total_params(), rel=1e-12)
    t_flops = flops / (fp32_tflops * 1e12 * dev.efficiency.gemm)
    t_mem = 5 * compressed * 4 / (dev.hbm_tbps * 1e12 * dev.efficiency.memory_bandwidth)
    assert (t_flops > t_mem) == (fp32_tflops < 1)  # each case exercises the branch it names
    assert seconds == pytest.approx(max(t_flops, t_mem), rel=1e-12)


# --------------------------------------------------------------------------- fp8 casts
def test_fp8_casts_of_a_moe_layer_with_a_shared_expert_by_hand():
    """torchao Float8Linear casts every linear's input and its weight on each forward.
    tiny-moe (h 64, q 64, k/v 32, o 64, SwiGLU; 4 experts of 64, top-2, 1 shared expert
    of 64), tp 1, ep 2, 2 x 32 tokens, listed linear by linear:
    wq, wk, wv read the normed x (64 each), wo the attention output (64); each of the 2
    routed copies of a token goes through w1 and w3 (64 each) and w2 (64); the shared
    expert's w1, w3 (64 each) and w2 (64). Weights: q, k, v, o; 3 matrices of 64 x 64
    for each of the 4 / 2 local experts and for the shared expert."""
    from partita.cost.compute import fp8_cast_elements
    from partita.cost.shape import LayerShape
    from partita.spec.load import load_model

    model = load_model("tiny-moe")
    shape = LayerShape(tp=1, cp=1, ep=2, mbs=2, seq_len=32, sp=False, dtype="fp8", framework="torchtitan", etp=1)
    attn = 64 + 64 + 64 + 64
    routed = 2 * (64 + 64 + 64)
    shared = 64 + 64 + 64
    weights = 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 64 * (4 // 2) + 3 * 64 * 64
    assert fp8_cast_elements(model, shape, True) == pytest.approx(64 * (attn + routed + shared) + weights, rel=1e-12)


# --------------------------------------------------------------------------- selective recompute
@pytest.mark.parametrize("q_lora_rank", [1536, 0])
def test_selective_recompute_share_of_mla_layers_by_hand(q_lora_rank):
    """Op-level selective checkpointing (torchtitan's "op" SAC, runtime/recompute.py) saves
    the output of every other matmul in execution order - the 1st, 3rd, ... - and
    recomputes the others. DeepSeek-V3's MLA attention (h 7168, 128 heads; q: down to 1536
    then up to 128 x (128 + 64), or without a q LoRA (DeepSeek-V2-Lite's form) one h x
    128 x 192 matrix; kv: down to 512 + 64 rope dims, up to 128 x (128 + 128)), wo (128 x
    128 -> h), then the SwiGLU MLP (3 x h x 18432) of a dense layer; per token FLOPs are
    proportional to the matrix sizes, listed here in execution order. A MoE layer runs the
    router (h x 256) after wo and its experts (8 routed + 1 shared, 3 x h x 2048 each),
    many equal matmuls in a row, half of whose FLOPs are recomputed."""
    import dataclasses

    from partita.cost.compute import selective_gemm_fraction
    from partita.spec.load import load_model

    base = load_model("deepseek-v3")
    model = dataclasses.replace(base, name=f"dsv3-q{q_lora_rank}", mla=dataclasses.replace(base.mla, q_lora_rank=q_lora_rank))
    h, heads = 7168, 128
    q = [h * 1536, 1536 * heads * 192] if q_lora_rank else [h * heads * 192]
    attn = q + [h * (512 + 64), 512 * heads * (128 + 128), heads * 128 * h]
    dense = attn + [h * 18432] * 3
    assert selective_gemm_fraction(model, False) == pytest.approx(sum(dense[1::2]) / sum(dense), rel=1e-12)
    moe = attn + [h * 256]
    experts = 3 * h * 2048 * (8 + 1)
    assert selective_gemm_fraction(model, True) == pytest.approx((sum(moe[1::2]) + experts / 2) / (sum(moe) + experts),
                                                                 rel=1e-12)


# --------------------------------------------------------------------------- HSDP states
@pytest.mark.parametrize("dp_shard", [1, 2, 4])
def test_hsdp_optimizer_state_per_rank_by_hand(dp_shard):
    """HSDP with ZeRO-1 on dp 4: the Adam state (fp32 master, m, v: 12 bytes per parameter)
    is sharded within groups of ``dp_shard`` ranks and replicated across them
    [Rajbhandari et al. 2020 sec. 5.1 within each group; torchtitan dp_shard x
    dp_replicate]: ``12 P / dp_shard`` per rank - a group of 1 shards nothing."""
    from partita.cost.memory import estimate_memory
    from partita.spec.load import load_model

    model = load_model("tiny-llama")
    plan = Plan(dp=4, dp_shard=dp_shard, zero=1, mbs=1, gbs=4, seq_len=64, dtype="bf16")
    (rank,) = estimate_memory(model, H100, plan)
    assert rank.parts["optimizer"] == pytest.approx(12 * model.total_params() / dp_shard, rel=1e-12)


# --------------------------------------------------------------------------- context parallel
def test_ring_attention_hop_across_nodes_by_hand():
    """Ring attention (Liu et al. 2023; Megatron-Core context parallel) with cp 2: each
    layer passes its K/V block (``tokens/cp x 2 kv_dim`` bf16 elements) ``cp - 1`` times
    forward and twice as many bytes backward (dK, dV), the exposed part being what the
    attention kernel does not hide. Moving the same plan from one node (2 devices) to two
    nodes (1 device each) changes only the hop: the attention it hides behind cancels in
    the difference, which is ``3 (cp - 1) (hop_net - hop_node)`` per layer and micro-batch,
    a hop being ``S / B + alpha`` on the NVLink or the NIC."""
    from partita.estimate import estimate
    from partita.spec.hardware import Cluster
    from partita.spec.load import load_model

    model = load_model("tiny-llama")  # 4 layers, kv_dim 32
    plan = Plan(cp=2, mbs=1, gbs=1, seq_len=256, dtype="bf16", zero=0)
    node, net = (estimate(model, Cluster(device=H100, nodes=n, devices_per_node=d), plan).time.parts["cp communication"]
                 for n, d in ((1, 2), (2, 1)))
    size = 256 / 2 * 2 * 32 * 2
    hop_node = size / (H100.intra_gbps * 1e9 * H100.efficiency.intra_node_comm) + H100.intra_latency_us * 1e-6
    hop_net = size / (H100.inter_gbps * 1e9 * H100.efficiency.inter_node_comm) + H100.inter_latency_us * 1e-6
    assert node > 0  # the exposed hop is positive in both, so max(0, .) does not clip either
    assert net - node == pytest.approx(4 * 3 * (2 - 1) * (hop_net - hop_node), rel=1e-9)


# --------------------------------------------------------------------------- more hand cases
def _gpt(**kw):
    """Korthikanti et al.'s GPT block: MHA, GeLU MLP of 4h, LayerNorm, dropout."""
    from partita.spec.model import ModelSpec

    args = dict(name="gpt-hand", hidden=1024, layers=8, heads=16, kv_heads=16, ffn_hidden=4096, vocab=1000,
                activation="gelu", norm="layernorm", dropout=True)
    return ModelSpec(**{**args, **kw})


def test_selective_recompute_share_of_a_gelu_layer_by_hand():
    """Every-other-matmul SAC on a GeLU (two-matrix) MLP layer: wq, wk, wv, wo, w1, w2 in
    execution order (h x h each for attention, h x 4h each for the MLP), the 2nd, 4th and
    6th recomputed: ``(h^2 + h^2 + 4h^2) / (4 h^2 + 8 h^2) = 1/2``."""
    from partita.cost.compute import selective_gemm_fraction

    assert selective_gemm_fraction(_gpt(), False) == pytest.approx(6 / 12, rel=1e-12)
    # a GeLU MoE layer (GPT-MoE / Switch style: 8 experts of 4h, top-2): wq, wk, wv, wo,
    # the router (h x 8), then the experts' 2 x 2 matrices of h x 4h, half recomputed
    from partita.spec.model import MoESpec

    moe = _gpt(name="gpt-moe-hand", moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden=4096))
    h = 1024
    gemms = [h * h] * 4 + [h * 8]
    experts = 2 * 2 * h * 4096
    assert selective_gemm_fraction(moe, True) == pytest.approx(
        (sum(gemms[1::2]) + experts / 2) / (sum(gemms) + experts), rel=1e-12)


def test_partial_recompute_keeps_inputs_of_the_first_n_layers_by_hand():
    """Megatron's block recompute of the first N layers of a stage (``--recompute-method
    block --recompute-num-layers N``): those N layers keep only their input (``2 sbh``
    bytes in 16 bits), the others everything - for this GPT block with flash attention
    ``34 sbh`` plus the fp32 log-sum-exp, ``4 s b a`` [Korthikanti et al. 2022, eq. 1
    without the score terms]. 8 layers, one stage, N = 3: compared with no recompute the
    activations drop by exactly ``3 (34 sbh + 4 sba - 2 sbh)``."""
    from partita.cost.memory import estimate_memory

    model = _gpt()
    s, b, h, a = 512, 2, 1024, 16
    base = Plan(mbs=b, gbs=b, seq_len=s, dtype="bf16", zero=0)
    none = estimate_memory(model, H100, base)[0].parts["activations"]
    part = estimate_memory(model, H100, base.with_(recompute="full", recompute_layers=3))[0].parts["activations"]
    assert none - part == pytest.approx(3 * (34 * s * b * h + 4 * s * b * a - 2 * s * b * h), abs=1e-3)


def test_no_data_parallel_reduction_sends_nothing():
    """dp x cp = 1: there is no gradient reduction, so no bytes are held for it or sent."""
    from partita.cost.memory import dp_gradient_bytes
    from partita.spec.load import load_model

    got = dp_gradient_bytes(load_model("tiny-llama"), Plan(dp=1, mbs=1, gbs=1, seq_len=64, zero=0))
    assert got["held"] == 0 and got["wire"] == 0 and got["state"] == 0


def test_powersgd_wire_count_of_a_moe_layer_with_a_shared_expert_by_hand():
    """PowerSGD rank 4 on tiny-moe (h 64, q 64, k/v 32, o 64; 4 SwiGLU experts of 64, a
    router 4 x 64, 1 shared SwiGLU expert of 64), dp 2, ep 1: per layer the matrices as
    nn.Linear stores them (out x in) - wq 64x64, wk/wv 32x64, wo 64x64, per expert w1/w3
    64x64 and w2 64x64, the router 4x64, the shared expert's w1/w3 64x64 and w2 64x64 -
    plus the 256 x 64 embedding and output layer. Compressed when ``2 r (n + m) < n m``
    (torch's rule; the router's 4 x 64 is sent whole), each as ``r (n + m)`` elements."""
    from partita.cost.compression import wire_count
    from partita.spec.load import load_model

    model = load_model("tiny-moe")
    r = 4
    layer = [(64, 64), (32, 64), (32, 64), (64, 64)] + [(64, 64)] * (3 * 4) + [(4, 64)] + [(64, 64)] * 3
    mats = layer * model.layers + [(256, 64), (256, 64)]
    sent = compressed = 0
    for n, m in mats:
        if 2 * min(n, m, r) * (n + m) < n * m:
            sent += min(n, m, r) * (n + m)
            compressed += n * m
    total = model.total_params()
    plan = Plan(dp=2, zero=0, mbs=1, gbs=2, seq_len=64, dtype="fp32", grad_compression="powersgd", powersgd_rank=r)
    c = wire_count(model, plan, total, model.layers, model.layers)
    assert c.compressed_elements == compressed
    assert c.wire_elements == sent + total - compressed


def test_fp8_casts_and_early_stop_gemm_of_a_gelu_layer_by_hand():
    """A GeLU MLP has two matrices. fp8 casts (torchao Float8Linear): per token wq, wk, wv
    read x (h each), wo the attention output (h), w1 x (h), w2 the 4h activation; weights
    4 h^2 + 2 x 4 h^2. The GEMM a checkpoint that stops early never reruns is w2's:
    ``2 x tokens x 4h x h`` FLOPs, timed as one GEMM of that size on the GEMM-size curve."""
    from partita.cost.compute import fp8_cast_elements, last_gemm
    from partita.cost.shape import LayerShape

    model, h, tokens = _gpt(), 1024, 2 * 512
    fp8 = LayerShape(tp=1, cp=1, ep=1, mbs=2, seq_len=512, sp=False, dtype="fp8", framework="torchtitan")
    per_token = 3 * h + h + h + 4 * h
    assert fp8_cast_elements(model, fp8, False) == pytest.approx(tokens * per_token + 4 * h * h + 8 * h * h, rel=1e-12)
    bf16 = fp8._replace(dtype="bf16")
    flops, seconds = last_gemm(model, H100, bf16, False)
    assert flops == pytest.approx(2 * tokens * 4 * h * h, rel=1e-12)
    assert seconds == pytest.approx(gemm_seconds(H100, flops, 1), rel=1e-12)


def test_partial_recompute_with_interleaved_stages_by_hand():
    """Block recompute of the first N = 1 layers of every virtual chunk (Megatron applies
    ``--recompute-num-layers`` per model chunk) with pp 2, vpp 2 and 2 layers per chunk:
    rank 0 runs chunks 0 and 2, so 2 of its 4 layers keep only their input. Interleaved
    1F1B's warm-up leaves rank 0 with ``2 (p - 1) + (v - 1) p + 1 = 5`` chunks in flight
    (Megatron's schedule; Korthikanti et al. 2022 sec. 4.2.3), each holding the average of
    the rank's chunks - so compared with no recompute the activations drop by
    ``5 x 2 / 2 x (34 sbh + 4 sba - 2 sbh)``."""
    from partita.cost.memory import estimate_memory

    model = _gpt()
    s, b, h, a = 512, 2, 1024, 16
    base = Plan(pp=2, vpp=2, layer_split=(2, 2, 2, 2), mbs=b, gbs=8 * b, seq_len=s, dtype="bf16", zero=0,
                schedule="interleaved-1f1b")
    none = estimate_memory(model, H100, base)[0].parts["activations"]
    part = estimate_memory(model, H100, base.with_(recompute="full", recompute_layers=1))[0].parts["activations"]
    assert none - part == pytest.approx(5 * 2 / 2 * (34 * s * b * h + 4 * s * b * a - 2 * s * b * h), abs=1e-3)


def test_traced_stem_and_head_split_by_tensor_parallel_by_hand():
    """A TP plan that also names 200 of the 500 parameters outside the blocks (a stem's or
    head's linear layers): with tp 2 rank 0 of the pipeline holds its 2 blocks' 700 each
    and ``500 - 200 + 200 / 2`` of the rest; bf16 working weights, 2 bytes each."""
    import dataclasses

    spec = dataclasses.replace(SPEC, tp_other_params=200)
    plan = Plan(dp=2, tp=2, pp=2, zero=1, mbs=4, gbs=32, seq_len=1, dtype="bf16")
    mem = traced_memory(spec, H100, plan)
    assert mem[0].parts["weights"] == pytest.approx(2 * (2 * 700 + 500 - 200 + 100))
    assert mem[1].parts["weights"] == pytest.approx(2 * 2 * 700)
