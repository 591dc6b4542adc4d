"""Each cost formula against a hand-computed case."""
import pytest

from partita.cost import comm
from partita.cost.memory import activation_bytes_per_layer, model_state_bytes
from partita.cost.pipeline import bubble_fraction, in_flight_chunks, pipeline_time
from partita.plan import Plan, axis_ranks, group_span
from partita.spec.hardware import load_device
from partita.spec.model import ModelSpec

H100 = load_device("h100-sxm")
B910 = load_device("ascend-910b2")


def test_all_reduce_inside_switch_node():
    # 8 ranks on NVSwitch: 2*(7/8)*S / (450e9 * eff) + 14 * 10 us
    S = 1e9
    bw = 450e9 * H100.efficiency["intra_node_comm"]
    assert comm.all_reduce(H100, S, 8, 1) == pytest.approx(2 * 7 / 8 * S / bw + 14 * 10e-6)


def test_all_reduce_full_mesh_scales_with_group_size():
    # HCCS mesh: a 2-NPU group drives one 28 GB/s link, 8 NPUs drive seven (algbw 18/36/72 GB/s measured)
    S = 1e9
    eff = B910.efficiency["intra_node_comm"]
    t2 = comm.all_reduce(B910, S, 2, 1) - 2 * 1 * 20e-6
    t8 = comm.all_reduce(B910, S, 8, 1) - 2 * 7 * 20e-6
    assert t2 == pytest.approx(2 * 0.5 * S / (28e9 * eff))
    assert t8 == pytest.approx(2 * 7 / 8 * S / (196e9 * eff))
    assert S / t2 == pytest.approx(28e9 * eff, rel=1e-6)  # algbw of 2 NPUs = one link


def test_hierarchical_all_reduce_crosses_network_with_s_over_g():
    S = 8e9
    intra = 2 * 7 / 8 * S / (450e9 * H100.efficiency["intra_node_comm"])
    inter = 2 * 3 / 4 * (S / 8) / (50e9 * H100.efficiency["inter_node_comm"])
    lat = (2 * 7 * 10 + 2 * 2 * 20) * 1e-6
    assert comm.all_reduce(H100, S, 8, 4) == pytest.approx(intra + inter + lat)


def test_all_gather_is_half_an_all_reduce_without_latency():
    S = 4e9
    ag = comm.all_gather(H100, S, 8, 2) - (7 * 10 + 1 * 20) * 1e-6
    ar = comm.all_reduce(H100, S, 8, 2) - (14 * 10 + 2 * 20) * 1e-6
    assert ag == pytest.approx(ar / 2)


def test_one_f_one_b_in_flight_and_bubble():
    assert [in_flight_chunks("1f1b", 4, 1, 8, r) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_chunks("1f1b", 4, 1, 2, 0) == 2  # fewer micro-batches than stages
    assert in_flight_chunks("gpipe", 4, 1, 8, 3) == 8
    # interleaved rank 0: v*p + p - 1 chunks = p (1 + (p-1)/(p v)) micro-batches of its layers
    assert in_flight_chunks("interleaved-1f1b", 4, 2, 8, 0) == 2 * 4 + 4 - 1
    assert bubble_fraction(8, 1, 56) == pytest.approx(7 / 63)
    assert pipeline_time([1.0] * 4, 8, 1, "1f1b") == pytest.approx(8 + 3)
    assert pipeline_time([1.0] * 4, 8, 2, "interleaved-1f1b") == pytest.approx(8 + 1.5)
    assert pipeline_time([1.0, 2.0], 4, 1, "1f1b") == pytest.approx(4 * 2 + 1)
    # zero-bubble (ZB-H1): a third of the 1F1B bubble
    assert pipeline_time([1.0] * 4, 8, 1, "zero-bubble") == pytest.approx(8 + 3 / 3)


def test_model_states_by_zero_stage():
    p = Plan(dp=8, zero=0)
    assert model_state_bytes(p, 1e9, 8) == {"weights": 2e9, "gradients": 4e9, "optimizer": 12e9}
    z1 = model_state_bytes(Plan(dp=8, zero=1), 1e9, 8)
    assert z1["optimizer"] == pytest.approx(12e9 / 8) and z1["gradients"] == 4e9
    z3 = model_state_bytes(Plan(dp=8, zero=3), 1e9, 8)
    assert sum(z3.values()) == pytest.approx(16e9 / 8)  # fp32 param is the master copy
    # zero 2 in fp32 (FSDP2 reshard_after_forward=False / DeepSpeed ZeRO-2): the gathered
    # fp32 parameters and the fp32 shard the optimizer updates
    assert model_state_bytes(Plan(dp=8, zero=2, dtype="fp32"), 1e9, 8)["weights"] == pytest.approx(4e9 + 4e9 / 8)
    # fp8: the bf16 working weight plus a cached fp8 copy (1 byte)
    assert model_state_bytes(Plan(dp=8, zero=1, dtype="fp8"), 1e9, 8)["weights"] == 3e9


def test_activations_reduce_to_korthikanti_for_gpt():
    # GPT block, 16-bit, dropout, MHA, ffn = 4h, no flash: Korthikanti's sbh*34 minus the
    # attention-score terms; with flash attention we add the fp32 log-sum-exp (4 bytes/head/token).
    h, a, s, b = 1024, 16, 512, 2
    gpt = ModelSpec(name="gpt", hidden=h, layers=1, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=1000,
                    activation="gelu", norm="layernorm", dropout=True)
    bytes_ = activation_bytes_per_layer(gpt, Plan(seq_len=s, mbs=b), moe=False)
    assert bytes_ == pytest.approx(s * b * h * 34 + s * b * 4 * a)
    # tensor parallel t=4 without SP: 10 sbh + 24 sbh / t (Korthikanti eq. 2, less the score terms)
    tp = activation_bytes_per_layer(gpt, Plan(seq_len=s, mbs=b, tp=4), moe=False)
    assert tp == pytest.approx(s * b * h * (10 + 24 / 4) + s * b * 4 * a / 4)
    sp = activation_bytes_per_layer(gpt, Plan(seq_len=s, mbs=b, tp=4, sp=True), moe=False)
    assert sp == pytest.approx(s * b * h * 34 / 4 + s * b * 4 * a / 4)
    full = activation_bytes_per_layer(gpt, Plan(seq_len=s, mbs=b, tp=4, sp=True, recompute="full"), moe=False)
    assert full == pytest.approx(2 * s * b * h / 4)


def test_mesh_layout_tp_innermost_pp_outermost():
    p = Plan(dp=4, tp=8, pp=2, gbs=8)
    assert axis_ranks(p, "tp", 9) == list(range(8, 16))
    assert axis_ranks(p, "dp", 1) == [1, 9, 17, 25]
    assert axis_ranks(p, "pp", 3) == [3, 35]
    assert group_span(p, "tp", 8) == (8, 1)
    assert group_span(p, "dp", 8) == (1, 4)
    assert group_span(Plan(dp=4, tp=2, gbs=4), "dp", 8) == (4, 1)


def test_memo_keys_follow_content_not_identity():
    """The cost model memoises per model and device; keys come from their content, so a
    device with other parameters never reads a freed one's entries (ids are reused)."""
    from partita.estimate import estimate
    from partita.plan import Plan
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    plan = Plan(dp=2, tp=2, sp=True, gbs=8, seq_len=64, mbs=1, dtype="fp32")
    model = load_model("tiny-llama")
    base = make_cluster("cpu", 4)
    assert make_cluster("cpu", 4).device.cache_key == base.device.cache_key
    assert load_model("tiny-llama").cache_key == model.cache_key
    times = []
    for framework_us in (0.0, 1000.0, 0.0, 1000.0):  # new device objects each time, freed in between
        cluster = make_cluster("cpu", 4, overrides={"efficiency": {"tp_framework_us_per_layer": framework_us}})
        times.append(estimate(model, cluster, plan).step_time_s)
        del cluster
    assert times[0] == times[2] and times[1] == times[3]
    # 4 layers x 4 micro-batches x 1 ms more with the framework term
    assert times[1] - times[0] == pytest.approx(4 * 4 * 1e-3, rel=1e-9)


# ---------------------------------------------------------------- every term, by hand
# A small configuration with round numbers, so each stage term and memory part can be
# written out by hand from the formulas in docs/cost_model.md. Zeroing or doubling any
# single term changes one of the figures below.
from partita.cost.memory import GIB, estimate_rank_memory, peak_memory  # noqa: E402
from partita.cost.step import estimate_step_time, stage_terms  # noqa: E402
from partita.spec.hardware import Cluster, Device, Efficiency  # noqa: E402
from partita.spec.model import MoESpec  # noqa: E402

HAND_EFF = Efficiency(gemm=0.5, gemm_fp8=0.5, attention=0.25, memory_bandwidth=0.5, intra_node_comm=0.5,
                      inter_node_comm=0.5, gemm_half_gflop=1.0, kernel_overhead_us_per_layer=10.0, tp_overlap=0.5,
                      tp_framework_us_per_layer=100.0, zero3_framework_us_per_layer=50.0)


def hand_cluster(devices: int, per_node: int) -> Cluster:
    # 100 TFLOPS bf16, 1 TB/s HBM, 100 GB/s inside a node (switch), 10 GB/s NIC, no latency
    dev = Device(name="hand", description="", peak_tflops={"bf16": 100.0}, hbm_gib=80, usable_gib=80, hbm_tbps=1.0,
                 runtime_reserved_gib=1.0, allocator_fragmentation=0.1, comm_buffer_mib_per_group=100.0,
                 intra_link="x", intra_topology="switch", intra_gbps=100.0, peer_gbps=100.0, devices_per_node=per_node,
                 intra_latency_us=0.0, inter_link="y", inter_gbps=10.0, inter_latency_us=0.0, efficiency=HAND_EFF,
                 source_file="test")
    return Cluster(device=dev, devices_per_node=per_node, nodes=devices // per_node)


# h = 1024, 8 heads of 128, 2 KV heads (kv_dim 256), SwiGLU f = 4096, V = 32000, 4 layers
HAND = ModelSpec(name="hand", hidden=1024, layers=4, heads=8, kv_heads=2, ffn_hidden=4096, vocab=32000)
HAND_MOE = ModelSpec(name="hand-moe", hidden=1024, layers=4, heads=8, kv_heads=2, ffn_hidden=4096, vocab=32000,
                     moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden=2048))
HAND_TIED = ModelSpec(name="hand-tied", hidden=1024, layers=4, heads=8, kv_heads=2, ffn_hidden=4096, vocab=32000,
                      tied_embeddings=True)
# rates: GEMM 1e14 x 0.5 x G / (G + 1) for G GFLOP per GEMM; attention 1e14 x 0.25;
# HBM 1e12 x 0.5; intra-node 100e9 x 0.5; network 10e9 x 0.5
HBM, INTRA, INTER = 5e11, 5e10, 5e9


def gemm_s(flops: float, count: int) -> float:
    g = flops / count / 1e9
    return flops / (1e14 * 0.5 * g / (g + 1))


def dense_layer(tokens: float, tp: int, seq: int) -> tuple[float, float, float, float]:
    """(time, FLOPs, GEMM time, element-wise time) of one dense HAND layer forward on one rank (sp on)."""
    proj = 2 * tokens * (1024 * (1024 + 2 * 256) + 1024 * 1024) / tp  # wq, wk, wv, wo
    mlp = 2 * tokens * 3 * 1024 * 4096 / tp  # w1, w3, w2
    attn = 2 * tokens * (seq + 1) / 2 * (8 / tp) * (128 + 128)  # causal: (s+1)/2 keys on average
    # norms + residuals 10h (sp: / tp), RoPE on q and k 2 (q + kv) / tp, SwiGLU 3 f / tp, 2 bytes each
    elem = tokens * 2 * (10 * 1024 / tp + 2 * (1024 + 256) / tp + 3 * 4096 / tp) / HBM
    gemm = gemm_s(proj, 4) + gemm_s(mlp, 3)
    return gemm + attn / 2.5e13 + elem + 10e-6, proj + mlp + attn, gemm, elem


def flash_extra(tokens: float, tp: int, seq: int) -> tuple[float, float]:
    """(time, FLOPs) the fused attention's backward adds beyond 2x its forward: it recomputes
    the scores, 5 matmuls against the forward's 2, so 2.5x (FlashAttention-2 sec. 4.1)."""
    attn = 2 * tokens * (seq + 1) / 2 * (8 / tp) * (128 + 128)
    return (2.5 - 2) * attn / 2.5e13, (2.5 - 2) * attn


def test_hand_stage_terms_dense_tp_pp():
    # tp 2 (sp) x pp 2 x dp 2 on 2 nodes of 4; mbs 1, seq 1024: 1024 tokens per micro-batch
    cluster = hand_cluster(8, 4)
    plan = Plan(dp=2, tp=2, pp=2, sp=True, mbs=1, gbs=4, seq_len=1024, zero=1)
    kinds, times = stage_terms(HAND, cluster, plan)
    t, flops, _, _ = dense_layer(1024, 2, 1024)
    fa, fa_flops = flash_extra(1024, 2, 1024)
    # tp all-reduce of b s h x 2 bytes inside a node (g = 2): 2 (1/2) S / 5e10
    ar = 1024 * 1024 * 2 / INTRA
    assert kinds.dense.compute == pytest.approx(3 * t + fa, rel=1e-12)  # forward + 2x backward (2.5x attention)
    assert kinds.dense.forward == pytest.approx(t, rel=1e-12)
    assert kinds.dense.backward == pytest.approx(2 * t + fa, rel=1e-12)
    assert kinds.dense.flops == pytest.approx(3 * flops + fa_flops, rel=1e-12)
    assert kinds.dense.recompute == 0.0
    # 2 collectives forward + 2 backward in each of attention and MLP, plus 100 us host work
    assert kinds.dense.tp_comm == pytest.approx(4 * ar + 100e-6, rel=1e-12)
    assert kinds.dense.cp_comm == 0.0 and kinds.dense.ep_all_to_all == 0.0
    # embedding: gather read + write of b s h x 2 bytes; one tp collective
    emb = 2 * 1024 * 1024 * 2 / HBM
    assert kinds.embedding.compute == pytest.approx(3 * emb, rel=1e-12)
    assert kinds.embedding.tp_comm == pytest.approx(ar, rel=1e-12)
    # output layer: 2 b s h V / tp FLOPs in one GEMM, cross-entropy reads V/tp logits x (2 + 3 x 4) bytes
    out_flops = 2 * 1024 * 1024 * 32000 / 2
    out = gemm_s(out_flops, 1) + 1024 * 16000 * 14 / HBM
    assert kinds.output.compute == pytest.approx(3 * out, rel=1e-12)
    assert kinds.output.flops == pytest.approx(3 * out_flops, rel=1e-12)
    assert kinds.output.tp_comm == pytest.approx(2 * ar, rel=1e-12)
    # pipeline: the pp neighbour is 4 ranks away = the next node; one send each way of b s h / tp x 2 bytes
    p2p = 2 * (1024 * 1024 * 2 / 2 / INTER)
    assert kinds.per_stage.pp_send_recv == pytest.approx(p2p, rel=1e-12)
    assert times.dense == pytest.approx(3 * t + fa + 4 * ar + 100e-6, rel=1e-12)
    # the step: 2 micro-batches through 2 stages (2 layers each; embedding first, output last)
    stage0 = 2 * (3 * t + fa + 4 * ar + 100e-6) + 3 * emb + ar + p2p
    stage1 = 2 * (3 * t + fa + 4 * ar + 100e-6) + 3 * out + 2 * ar + p2p
    step = estimate_step_time(HAND, cluster, plan)
    assert [s.total for s in step.stages] == pytest.approx([stage0, stage1], rel=1e-12)
    assert step.parts["pipeline bubble"] == pytest.approx(min(stage0, stage1), rel=1e-12)  # (sum - max) / vpp


def test_hand_recompute_terms():
    cluster = hand_cluster(8, 4)
    t, flops, gemm, elem = dense_layer(1024, 2, 1024)
    fa, fa_flops = flash_extra(1024, 2, 1024)
    ar = 1024 * 1024 * 2 / INTRA
    full, _ = stage_terms(HAND, cluster, Plan(dp=2, tp=2, pp=2, sp=True, gbs=4, seq_len=1024, recompute="full"))
    assert full.dense.recompute == pytest.approx(t, rel=1e-12)  # the forward once more
    assert full.dense.backward == pytest.approx(3 * t + fa, rel=1e-12)
    assert full.dense.flops == pytest.approx(4 * flops + fa_flops, rel=1e-12)
    # the forward's 2 + 2 collectives again; the host work of a forward (a third) again
    assert full.dense.tp_comm == pytest.approx(6 * ar + 100e-6 * (1 + 1 / 3), rel=1e-12)
    assert full.embedding.recompute == 0.0 and full.output.recompute == 0.0
    # op-level SAC (torchtitan's; under megatron selective is the core_attn module: tests/test_megatron_selective.py)
    sel, _ = stage_terms(HAND, cluster, Plan(dp=2, tp=2, pp=2, sp=True, gbs=4, seq_len=1024, recompute="selective",
                                             framework="torchtitan"))
    # every other matmul of wq wk wv wo w1 w3 w2: wk, wo, w3 = (kv + o + f) / (q + 2 kv + o + 3 f)
    share = (256 + 1024 + 4096) / (1024 + 2 * 256 + 1024 + 3 * 4096)
    assert sel.dense.recompute == pytest.approx(elem + share * gemm, rel=1e-12)
    assert sel.dense.tp_comm == pytest.approx(4 * ar + 100e-6, rel=1e-12)


def test_hand_overlapped_tp_and_context_parallel():
    # cp 2 with tp 2 on nodes of 2: the cp neighbour (2 ranks away) is on the next node
    cluster = hand_cluster(4, 2)
    plan = Plan(dp=1, tp=2, cp=2, sp=True, gbs=1, seq_len=1024, zero=0, tp_comm_overlap=True)
    kinds, _ = stage_terms(HAND, cluster, plan)
    tokens = 512
    ar = tokens * 1024 * 2 / INTRA * (1 - 0.5)  # half hidden by the overlap
    assert kinds.dense.tp_comm == pytest.approx(4 * ar + 100e-6, rel=1e-12)
    # ring attention: one K/V hop (2 kv_dim / tp x 2 bytes per token) per other cp rank,
    # hidden behind this rank's attention kernel; forward, 2x backward
    hop = tokens * 2 * 256 * 2 / 2 / INTER
    attn = 2 * tokens * 1025 / 2 * 4 * 256 / 2.5e13
    assert kinds.dense.cp_comm == pytest.approx(3 * (hop - attn), rel=1e-12) and hop > attn
    t, _, _, _ = dense_layer(tokens, 2, 1024)
    assert kinds.dense.compute == pytest.approx(3 * t + flash_extra(tokens, 2, 1024)[0], rel=1e-12)
    # a device whose ring exchange shares the compute's cores (comm_overlap 0.3): 70 % of the
    # hop adds in full, 30 % hides behind the attention kernel (here it fits under it)
    from dataclasses import replace
    slow = Cluster(device=replace(cluster.device, efficiency=replace(HAND_EFF, comm_overlap=0.3)),
                   devices_per_node=2, nodes=2)
    part, _ = stage_terms(HAND, slow, plan)
    assert part.dense.cp_comm == pytest.approx(3 * (0.7 * hop + max(0.0, 0.3 * hop - attn)), rel=1e-12)
    assert 0.3 * hop < attn < hop
    # Partita's runtime all-gathers K and V over the cp group instead (cost/frameworks.py
    # cp_kv_all_gather): per layer an all-gather each of K and V forward, a reduce-scatter each
    # backward, nothing hidden; each buffer is the whole sequence's K (or V): 1024 tokens x
    # 256 / tp 2 x 2 bytes = 256 KiB, and a 2-rank ring across the nodes moves half of it at 5 GB/s
    gathered, _ = stage_terms(HAND, cluster, plan.with_(framework="partita"))
    each = 1024 * 256 / 2 * 2
    assert gathered.dense.cp_comm == pytest.approx(2 * (each / 2 / INTER + each / 2 / INTER), rel=1e-12)


def test_hand_moe_terms_and_expert_memory():
    # 4 experts, top 2, ep 2 carved from dp 2, tp 1, one node of 4
    cluster = hand_cluster(2, 4)
    plan = Plan(dp=2, ep=2, gbs=2, seq_len=1024, zero=1, overlap_grad_reduce=False, overlap_param_gather=False)
    kinds, _ = stage_terms(HAND_MOE, cluster, plan)
    tokens = 1024
    # dispatch + combine, forward and backward, of top_k b s h x 2 bytes; half stays on the rank
    a2a = (1 / 2) * tokens * 2 * 1024 * 2 / INTRA
    assert kinds.moe.ep_all_to_all == pytest.approx(4 * a2a, rel=1e-12)
    proj = 2 * tokens * (1024 * (1024 + 512) + 1024 * 1024)
    router = 2 * tokens * 1024 * 4
    routed = 2 * tokens * 2 * 3 * 1024 * 2048  # top_k x SwiGLU(2048) per token
    attn = 2 * tokens * 1025 / 2 * 8 * 256
    assert kinds.moe.flops == pytest.approx(3 * (proj + router + routed + attn) + 0.5 * attn, rel=1e-12)
    assert kinds.dense == (0.0,) * 9  # no dense layer in this model
    # memory: routed experts divided by ep, the rest replicated; fp32 grads, Adam sharded over dp
    expert = 4 * 4 * 3 * 1024 * 2048 / 2  # layers x experts x expert params / ep
    layer_rest = HAND_MOE.layer_kind_params(True) - 4 * 3 * 1024 * 2048
    dense = 4 * layer_rest + 2 * 32000 * 1024 + 1024  # layers, embedding, output + final norm
    parts = estimate_rank_memory(HAND_MOE, cluster.device, plan, 0).parts
    assert parts["weights"] == pytest.approx(2 * (dense + expert), rel=1e-12)
    assert parts["gradients"] == pytest.approx(4 * (dense + expert), rel=1e-12)
    # dense states over dp = 2; expert states over the expert data-parallel group dp / ep = 1
    assert parts["optimizer"] == pytest.approx(12 * dense / 2 + 12 * expert, rel=1e-12)
    step = estimate_step_time(HAND_MOE, cluster, plan)
    # Adam: 34 bytes per local parameter (read grad, master, m, v; write master, m, v, bf16 copy; zero grad)
    assert step.parts["optimizer step"] == pytest.approx(34 * (dense / 2 + expert) / HBM, rel=1e-12)
    # zero 1 without overlap: reduce-scatter of fp32 grads + all-gather of bf16 weights over dp (g = 2)
    rs_ag = 0.5 * dense * 4 / INTRA + 0.5 * dense * 2 / INTRA
    assert step.parts["dp gradient sync"] == pytest.approx(rs_ag, rel=1e-12)


def test_hand_memory_parts():
    cluster = hand_cluster(8, 4)
    plan = Plan(dp=2, tp=2, pp=2, sp=True, mbs=1, gbs=4, seq_len=1024, zero=1)
    layer = HAND.layer_kind_params(False)
    # rank 0: 2 layers and the embedding, / tp - except the two RMSNorm weights (2h per
    # layer), which tensor parallelism replicates
    params0 = 2 * ((layer - 2 * 1024) / 2 + 2 * 1024) + 32000 * 1024 / 2
    parts = estimate_rank_memory(HAND, cluster.device, plan, 0).parts
    assert parts["weights"] == pytest.approx(2 * params0, rel=1e-12)
    assert parts["gradients"] == pytest.approx(4 * params0, rel=1e-12)
    assert parts["optimizer"] == pytest.approx(12 * params0 / 2, rel=1e-12)
    # activations per layer (sp, tp 2): tokens x (4h x 2 bytes / tp outside; q, k, v, o x 2 / tp,
    # fp32 LSE per head / tp, 3 f x 2 / tp inside) = 1024 x (4096 + 2560 + 16 + 12288)
    per_layer = 1024 * (4 * 1024 * 2 / 2 + 2 * (1024 + 512 + 1024) / 2 + 4 * 8 / 2 + 2 * 3 * 4096 / 2)
    embedding_out = 1024 * 2 * 1024 / 2
    # 1F1B rank 0 of 2 holds min(m, p) = 2 micro-batches
    assert parts["activations"] == pytest.approx(2 * (2 * per_layer + embedding_out), rel=1e-12)
    assert parts["transient"] == pytest.approx(2 * per_layer, rel=1e-12)  # one layer's activations + their grads
    assert parts["communication buffers"] == 4 * 100 * 2 ** 20  # tp, dp, pp groups + the world
    allocated = sum(v for k, v in parts.items() if k not in ("allocator fragmentation", "runtime (context, workspaces)"))
    assert parts["allocator fragmentation"] == pytest.approx(0.1 * allocated, rel=1e-12)
    assert parts["runtime (context, workspaces)"] == GIB
    last = estimate_rank_memory(HAND, cluster.device, plan, 1).parts
    # last rank: the logits and fp32 softmax (V / tp x (2 + 4) bytes per token) outweigh a layer's
    assert last["transient"] == pytest.approx(1024 * 16000 * 6, rel=1e-12)
    assert last["activations"] == pytest.approx(1 * 2 * per_layer, rel=1e-12)  # rank 1 holds 1 micro-batch
    assert peak_memory(HAND, cluster.device, plan) == (sum(last.values()), 1)  # the logits make rank 1 the peak
    # op-level selective (torchtitan): keep the input (2h / tp), q, v, o, w1 output and LSE: 1024 x (2048 + 2304 + 16 + 4096)
    sel = estimate_rank_memory(HAND, cluster.device, plan.with_(recompute="selective", framework="torchtitan"), 1).parts
    kept = 1024 * (2 * 2 * 1024 / 2 + 2 * (1024 + 256 + 1024 + 4096) / 2 + 4 * 8 / 2)
    assert sel["activations"] == pytest.approx(2 * kept, rel=1e-12)
    # megatron's selective is its core_attn module: everything but the fp32 LSE (8 heads / tp) is kept
    sel = estimate_rank_memory(HAND, cluster.device, plan.with_(recompute="selective"), 1).parts
    assert sel["activations"] == pytest.approx(2 * (per_layer - 1024 * 4 * 8 / 2), rel=1e-12)


def test_hand_zero3_and_tied_embedding():
    cluster = hand_cluster(8, 4)
    plan = Plan(dp=2, tp=2, pp=2, sp=True, gbs=4, seq_len=1024, zero=3)
    # rank 1: 2 layers, final norm, output layer; tp splits all but the norms (replicated)
    layer = (HAND.layer_kind_params(False) - 2 * 1024) / 2 + 2 * 1024
    params1 = 2 * layer + 1024 + 32000 * 1024 / 2
    parts = estimate_rank_memory(HAND, cluster.device, plan, 1).parts
    # zero 3: the fp32 master is the parameter: 4 + 4 + 8 bytes, all over dp = 2
    assert parts["weights"] == pytest.approx(4 * params1 / 2, rel=1e-12)
    assert parts["gradients"] == pytest.approx(4 * params1 / 2, rel=1e-12)
    assert parts["optimizer"] == pytest.approx(8 * params1 / 2, rel=1e-12)
    # FSDP on the last rank, the largest of three phases over the activations: loss and
    # output backward (logits + fp32 softmax, the bf16 output weight and its bf16 gradient,
    # the last layer prefetched); the last layer's backward (its working set, the output's
    # fp32 reduce-scatter input, the layer and the next one gathered); any other unit
    # (U (2 + 4) + 2 L). The part is that peak less the transient (the logits here).
    output_unit = 1024 + 32000 * 1024 / 2
    logits = 1024 * 16000 * (2 + 4)
    layer_working = 2 * 1024 * (4 * 1024 * 2 / 2 + 2 * (1024 + 512 + 1024) / 2 + 4 * 8 / 2 + 2 * 3 * 4096 / 2)
    phases = (logits + 2 * 2 * output_unit + 2 * layer, layer_working + 4 * output_unit + 2 * 2 * layer,
              layer_working + 6 * layer + 2 * layer)
    assert phases[0] == max(phases) and logits > layer_working
    assert parts["transient"] == pytest.approx(logits, rel=1e-12)
    assert parts["zero3 gathered layers"] == pytest.approx(phases[0] - logits, rel=1e-12)
    # 128 tokens: the logits shrink with the tokens, the output layer does not, so the last
    # layer's backward (with the output layer's fp32 reduce-scatter input held) is the peak
    short = estimate_rank_memory(HAND, cluster.device, plan.with_(seq_len=128), 1).parts
    logits, layer_working = logits / 8, layer_working / 8
    phases = (logits + 2 * 2 * output_unit + 2 * layer, layer_working + 4 * output_unit + 2 * 2 * layer,
              layer_working + 6 * layer + 2 * layer)
    assert phases[1] == max(phases) and phases[1] > phases[0] * 1.05
    assert short["zero3 gathered layers"] == pytest.approx(phases[1] - max(logits, layer_working), rel=1e-12)
    # a middle rank's largest unit is a layer: (2 + 4) + 2 bytes per layer parameter
    mid = estimate_rank_memory(HAND, hand_cluster(8, 4).device, plan.with_(dp=1, pp=4), 1).parts
    assert mid["zero3 gathered layers"] == pytest.approx(layer * 8, rel=1e-12)
    step = estimate_step_time(HAND, cluster, plan)
    # per micro-batch: all-gather bf16 weights forward and backward, reduce-scatter fp32 grads, dp g = 2
    traffic = 2 * 0.5 * params1 * 2 / INTRA + 0.5 * params1 * 4 / INTRA
    stage1 = step.stages[1]
    compute = stage1.parts["compute"] + stage1.parts["recompute"]
    exposed = max(0.0, traffic - compute) + traffic / 2 + 2 * 50e-6
    assert stage1.parts["zero3 gather/scatter"] == pytest.approx(exposed, rel=1e-12)
    # tied embeddings: first and last stage all-reduce the V h / tp fp32 gradient across 2 nodes
    tied = estimate_step_time(HAND_TIED, cluster, plan.with_(zero=1))
    assert tied.parts["tied embedding sync"] == pytest.approx(2 * 0.5 * 32000 * 1024 / 2 * 4 / INTER, rel=1e-12)
    # a pipeline inside one node all-reduces over the node's links
    one_node = estimate_step_time(HAND_TIED, hand_cluster(8, 8), plan.with_(zero=1))
    assert one_node.parts["tied embedding sync"] == pytest.approx(2 * 0.5 * 32000 * 1024 / 2 * 4 / INTRA, rel=1e-12)


def test_efficiency_record_reads_as_before_and_names_its_sources(tmp_path):
    dev = load_device("ascend-910b2")
    assert dev.efficiency["gemm"] == dev.efficiency.gemm == 0.681  # fitted on the Ascend rows (bench/fit.py)
    assert dict(dev.efficiency)["tp_overlap"] == 0.5 and len(dev.efficiency) == len(dict(dev.efficiency)) >= 11
    assert dev.efficiency.source("gemm").startswith("fitted:") and dev.efficiency.source("attention").startswith("fitted:")
    assert dev.efficiency.source("tp_framework_us_per_layer").startswith("default:")
    assert load_device("h100-sxm").efficiency.source("gemm").startswith("fitted:")
    over = load_device("cpu", {"efficiency": {"gemm": 0.1}})
    assert over.efficiency.gemm == 0.1 and over.efficiency.source("gemm").startswith("override:")
    with pytest.raises(KeyError):
        dev.efficiency["no_such_field"]
    # a file `partita calibrate` wrote: its own fields are measured, the rest come from its base
    import json
    calibrated = tmp_path / "my-cpu.json"
    calibrated.write_text(json.dumps({"name": "my-cpu", "extends": "cpu", "calibration": {"world": 2},
                                      "efficiency": {"gemm": 0.8, "tp_framework_us_per_layer": 40000.0}}))
    mine = load_device(str(calibrated))
    assert mine.efficiency.gemm == 0.8 and mine.efficiency.tp_framework_us_per_layer == 40000.0
    assert mine.efficiency.source("gemm") == mine.efficiency.source("tp_framework_us_per_layer") \
        == "measured: partita calibrate (my-cpu.json)"
    assert mine.efficiency.attention == 0.3 and mine.efficiency.source("attention").startswith("measured: torch.matmul")


def test_estimate_says_does_not_fit_with_the_shortfall_and_fits_with_the_headroom():
    """Issue 12 item 6: one meaning of fits (the search's), the marker first, the headroom or
    the shortfall stated; a plan that does not fit is still estimated."""
    from partita.cost.memory import memory_limit_gib
    from partita.estimate import estimate
    from partita.spec.hardware import make_cluster
    from partita.spec.load import load_model
    model, cluster = load_model("llama3-70b"), make_cluster("h100-sxm", 64)
    small = estimate(model, cluster, Plan(dp=8, tp=8, gbs=64, seq_len=8192, zero=3, recompute="full"))
    big = estimate(model, cluster, Plan(dp=64, gbs=64, seq_len=8192, zero=1))
    limit = memory_limit_gib(cluster.device, 0.0)
    assert small.fits and small.peak_memory_gib <= limit
    assert small.memory_verdict.startswith("fits: ")
    assert small.headroom_gib == pytest.approx(limit - small.peak_memory_gib) and small.headroom_gib > 0
    hbm = cluster.device.hbm_gib
    assert f"<= {limit:.1f} GiB usable ({hbm:.1f} GiB HBM - {hbm - limit:.1f} GiB reserved)" in small.memory_verdict
    # "does not fit" only when P(fit) < 5 % (issue 33), the limit named the same way
    assert not big.fits and big.p_fit < 0.05 and big.memory_verdict.startswith("DOES NOT FIT (P(fit) < 0.05): ")
    assert f"peak {big.peak_memory_gib:.1f} GiB" in big.memory_verdict and f"> {limit:.1f} GiB usable" in big.memory_verdict
    assert big.to_dict()["headroom_gib"] < 0 and big.to_dict()["memory_verdict"] == big.memory_verdict


def test_gradient_accumulation_mode_zero2_and_zero3():
    """plan.grad_accum_mode under ZeRO-2/3 with 4 micro-batches: sharded (default) holds 1/dp
    of the gradients and reduce-scatters every micro-batch; unsharded holds them whole and
    reduce-scatters once per step."""
    cluster = hand_cluster(2, 4)
    base = Plan(dp=2, gbs=8, mbs=1, seq_len=1024, zero=2, overlap_grad_reduce=False, overlap_param_gather=False)
    assert base.grad_accum == 4 and base.grad_accum_mode == "sharded"
    sharded = estimate_rank_memory(HAND, cluster.device, base, 0).parts
    params = sharded["weights"] / 2  # bf16 working weights, not sharded under zero 2
    assert sharded["gradients"] == pytest.approx(4 * params / 2, rel=1e-12)
    unsharded = estimate_rank_memory(HAND, cluster.device, base.with_(grad_accum_mode="unsharded"), 0).parts
    assert unsharded["gradients"] == pytest.approx(4 * params, rel=1e-12)
    # fp32 gradients reduce-scattered, bf16 weights all-gathered, over dp 2 inside a node: (g-1)/g S / B
    rs, ag = 0.5 * 4 * params / INTRA, 0.5 * 2 * params / INTRA
    t_sharded = estimate_step_time(HAND, cluster, base).parts["dp gradient sync"]
    t_unsharded = estimate_step_time(HAND, cluster, base.with_(grad_accum_mode="unsharded")).parts["dp gradient sync"]
    assert t_sharded == pytest.approx(4 * rs + ag, rel=1e-12)
    assert t_unsharded == pytest.approx(rs + ag, rel=1e-12)
    # zero 3: sharded reduces inside every micro-batch's traffic; unsharded once, after the pipeline
    z3 = base.with_(zero=3)
    s3, u3 = estimate_step_time(HAND, cluster, z3), estimate_step_time(HAND, cluster, z3.with_(grad_accum_mode="unsharded"))
    assert "dp gradient sync" not in s3.parts
    # ... and its per-micro-batch traffic is the two all-gathers only, so less is exposed
    assert u3.parts["zero3 gather/scatter"] < s3.parts["zero3 gather/scatter"]
    assert u3.parts["dp gradient sync"] == pytest.approx(0.5 * 4 * params / INTRA, rel=1e-12)
    assert estimate_rank_memory(HAND, cluster.device, z3.with_(grad_accum_mode="unsharded"), 0).parts["gradients"] == \
        pytest.approx(4 * params, rel=1e-12)


def test_peak_memory_as_each_statistic_reads_it():
    """allocated < reserved (+ fragmentation) < device reading (+ runtime reservation), by
    exactly those parts of the breakdown."""
    from partita.estimate import estimate
    cluster = hand_cluster(8, 4)
    est = estimate(HAND, cluster, Plan(dp=2, tp=2, pp=2, sp=True, mbs=1, gbs=4, seq_len=1024, zero=1))
    parts = est.peak_rank.parts
    assert est.peak_memory_gib_as("device") == est.peak_memory_gib
    assert est.peak_memory_gib_as("reserved") == pytest.approx(est.peak_memory_gib - 1.0, rel=1e-12)  # 1 GiB runtime
    allocated = sum(v for k, v in parts.items() if k not in ("allocator fragmentation", "runtime (context, workspaces)"))
    assert est.peak_memory_gib_as("allocated") == pytest.approx(allocated / GIB, rel=1e-12)
    assert est.peak_memory_gib_as("reserved") == pytest.approx(allocated * 1.1 / GIB, rel=1e-12)  # 10 % fragmentation


def test_collectives_with_one_rank_per_node_use_only_the_network():
    """g = 1 member per node on k nodes: no intra-node term at all, the network carries
    (k-1)/k of the buffer (all-gather / reduce-scatter) or twice that (all-reduce)."""
    dev = hand_cluster(8, 1).device  # no latency on the hand device
    size = 1e9
    assert comm.all_gather(dev, size, 1, 4) == pytest.approx(3 / 4 * size / INTER, rel=1e-12)
    assert comm.reduce_scatter(dev, size, 1, 4) == pytest.approx(3 / 4 * size / INTER, rel=1e-12)
    assert comm.all_reduce(dev, size, 1, 4) == pytest.approx(2 * 3 / 4 * size / INTER, rel=1e-12)
    assert comm.all_to_all(dev, size, 1, 4) == pytest.approx(3 / 4 * size / INTER, rel=1e-12)


def test_published_moe_rows_load_with_their_experts_and_ep():
    """A MoE row of the published runs becomes a MoE model (MOE_ARCH, from the model's
    released config) with the row's expert parallelism - not a dense stand-in."""
    from partita.errors import PartitaError
    from published_runs import _case
    row = {"source": "NVIDIA/dgxc-benchmarking v25.04.02 grok1 README", "model_name": "Grok-1-314B",
           "n_layers": "64", "hidden": "6144", "ffn_hidden": "32768", "n_heads": "48", "n_kv_heads": "8",
           "vocab": "128256", "seq_len": "8192", "n_experts": "8", "top_k": "2", "hardware": "H100-80GB-SXM (DGX)",
           "n_devices": "512", "tp": "4", "pp": "8", "vpp": "8", "dp": "8", "cp": "2", "ep": "8",
           "zero_stage/fsdp": "distributed optimizer", "sequence_parallel": "y", "recompute": "none",
           "micro_batch": "1", "global_batch": "1024", "measured_metric": "iter_time_s", "measured_value": "20.0",
           "notes": "precision=bf16"}
    case = _case(row)
    moe = case.model.moe
    assert (moe.num_experts, moe.top_k, moe.expert_ffn_hidden) == (8, 2, 32768) and case.plan.ep == 8
    assert all(case.model.moe_flags) and case.measured == 20.0
    with pytest.raises(PartitaError, match="MOE_ARCH"):
        _case(dict(row, model_name="Unknown-MoE"))


@pytest.mark.parametrize("overlap", [0.0, 0.4])
def test_hand_zero3_traffic_only_its_overlapping_share_hides(overlap):
    """A device whose FSDP gathers and reduce-scatters run on the compute's own cores (gloo
    on a CPU, ``comm_overlap`` f < 1): per micro-batch the serial share ``(1 - f) t`` and
    FSDP's copies around it add in full and only ``f t`` hides behind compute, the first
    layer's ``f t / n`` still exposed. By hand on one node of 2 (dp 2, no pp): t = two bf16 all-gathers + one fp32
    reduce-scatter of the 4 layers + ends, each moving half the bytes at 50 GB/s."""
    from dataclasses import replace
    cluster = hand_cluster(2, 2)
    dev = replace(cluster.device, efficiency=replace(HAND_EFF, comm_overlap=overlap))
    plan = Plan(dp=2, zero=3, gbs=2, seq_len=1024)
    params = HAND.total_params()
    traffic = 2 * 0.5 * params * 2 / INTRA + 0.5 * params * 4 / INTRA
    stage = estimate_step_time(HAND, Cluster(device=dev, devices_per_node=2, nodes=1), plan).stages[0]
    compute = stage.parts["compute"] + stage.parts["recompute"]
    assert traffic < compute  # the hidden share fits under compute: only the serial share and the first layer's show
    # FSDP2's copies at HBM 1 TB/s x 0.5: per all-gather the shard into the send buffer (S/2
    # read + written) and the gathered buffer out to the parameters (S read + written), twice;
    # the fp32 gradients into the reduce-scatter input (G) and the received shard (G/2):
    # S = 2 P (bf16), G = 4 P -> 2 (2 P + 4 P) + 8 P + 4 P = 24 P bytes
    copies = 24 * params / HBM
    exposed = (1 - overlap) * (traffic + copies) + overlap * traffic / 4 + 4 * 50e-6
    assert stage.parts["zero3 gather/scatter"] == pytest.approx(exposed, rel=1e-12)


def test_hand_hsdp_states_and_traffic():
    """HSDP (dp 4 = 2 replica groups x dp_shard 2): the states are sharded over the 2 ranks
    of a shard group only, the gradients reduce-scattered inside it and the shard
    all-reduced across the replicas (FSDP2 on a 2-D mesh, Zhao et al. 2023 sec. 3.2.2)."""
    cluster = hand_cluster(4, 2)  # 2 nodes of 2: the shard group {0, 1} in a node, the replicas {0, 2} across
    plan = Plan(dp=4, dp_shard=2, zero=3, gbs=4, seq_len=1024)
    params = HAND.total_params()
    parts = estimate_rank_memory(HAND, cluster.device, plan, 0).parts
    assert parts["weights"] == pytest.approx(4 * params / 2, rel=1e-12)  # not / 4
    assert parts["gradients"] == pytest.approx(4 * params / 2, rel=1e-12)
    assert parts["optimizer"] == pytest.approx(8 * params / 2, rel=1e-12)
    full_shard = estimate_rank_memory(HAND, cluster.device, plan.with_(dp_shard=0), 0).parts
    assert full_shard["optimizer"] == pytest.approx(8 * params / 4, rel=1e-12)
    # per micro-batch: bf16 all-gather forward and backward and the fp32 reduce-scatter in
    # the shard group (g = 2, one node), then the fp32 shard all-reduced across 2 nodes
    traffic = 2 * 0.5 * params * 2 / INTRA + 0.5 * params * 4 / INTRA + 2 * 0.5 * (params * 4 / 2) / INTER
    stage = estimate_step_time(HAND, cluster, plan).stages[0]
    compute = stage.parts["compute"] + stage.parts["recompute"]
    exposed = max(0.0, traffic - compute) + traffic / 4 + 4 * 50e-6
    assert stage.parts["zero3 gather/scatter"] == pytest.approx(exposed, rel=1e-12)
    # zero 2 HSDP: one reduce-scatter + replica all-reduce and one all-gather after the step
    # (no overlap): the shard group's traffic plus the shard's all-reduce
    z2 = estimate_step_time(HAND, cluster, plan.with_(zero=2, gbs=4, overlap_grad_reduce=False,
                                                      overlap_param_gather=False))
    sync = 0.5 * params * 4 / INTRA + 2 * 0.5 * (params * 4 / 2) / INTER + 0.5 * params * 2 / INTRA
    assert z2.parts["dp gradient sync"] == pytest.approx(sync, rel=1e-12)


def test_expert_dp_span_of_folded_ep_follows_megatrons_rank_order():
    """Hand-placed ranks on 8-device nodes. ep inside dp x cp (dp4 tp2 ep4): ep members are
    tp=2 apart, so the expert-dp pair of rank 0 is rank 8 - two nodes. ep folded into tp
    (dp2 tp4 ep4: ep does not divide dp x cp): ep groups are 4 consecutive ranks, so the
    pair is ranks 0 and 4 - one node."""
    from partita.cost.shape import expert_dp_span
    assert expert_dp_span(Plan(dp=4, tp=2, ep=4, mbs=1, gbs=8, seq_len=128), 8) == (1, 2)
    assert expert_dp_span(Plan(dp=2, tp=4, ep=4, mbs=1, gbs=8, seq_len=128), 8) == (2, 1)


def test_partita_zero1_all_reduces_then_broadcasts_tensor_by_tensor():
    """Partita's runtime runs zero 1 as an all-reduce of the full fp32 gradients after the
    last micro-batch, then one broadcast per parameter tensor from its owner (cost/frameworks.py
    zero1_grad_all_reduce, param_broadcast_per_tensor); a device whose collectives share the
    compute's cores (comm_overlap 0) hides none of a DDP all-reduce behind the backward."""
    from dataclasses import replace
    base = hand_cluster(2, 2)
    dev = replace(base.device, intra_latency_us=30.0)
    cluster = Cluster(device=dev, devices_per_node=2, nodes=1)
    plan = Plan(dp=2, gbs=2, seq_len=1024, zero=1, framework="partita")
    dense = 4 * HAND.layer_kind_params(False) + 2 * 32000 * 1024 + 1024
    lat = 30e-6
    all_reduce = 2 * 0.5 * dense * 4 / INTRA + 2 * lat      # ring: 2 (n-1)/n S, 2 (n-1) latency steps
    gather = 0.5 * dense * 2 / INTRA + lat                   # bf16 weights, (n-1)/n S
    tensors = 4 * 9 + 3                                      # 9 per layer, embedding, final norm, output
    step = estimate_step_time(HAND, cluster, plan)
    assert step.parts["dp gradient sync"] == pytest.approx(all_reduce + gather + (tensors - 1) * lat, rel=1e-12)
    # zero 0 under DDP overlaps the backward; with comm_overlap 0 all of it adds
    ddp = plan.with_(zero=0)
    hidden = estimate_step_time(HAND, cluster, ddp).parts.get("dp gradient sync", 0.0)
    serial = Cluster(device=replace(dev, efficiency=replace(HAND_EFF, comm_overlap=0.0)), devices_per_node=2, nodes=1)
    exposed = estimate_step_time(HAND, serial, ddp).parts["dp gradient sync"]
    assert exposed == pytest.approx(all_reduce, rel=1e-12) and hidden < 0.5 * all_reduce


@pytest.mark.parametrize("name", ["tiny-llama", "small-llama", "tiny-moe"])
def test_parameter_tensor_count_matches_the_reference_models(name):
    """The broadcast calls of zero 1 are the model's parameter tensors: the count per stage
    equals what ``named_parameters()`` of Partita's reference model holds."""
    from partita.cost.memory import rank_shapes
    from partita.cost.step import param_tensors
    from partita.models.llama import build_model
    from partita.spec.load import load_model
    model = build_model(name)
    names = [n for n, _ in model.named_parameters()]
    spec = load_model(name)
    whole = Plan(dp=1, gbs=1, seq_len=16)
    assert param_tensors(spec, whole, rank_shapes(spec, whole)[0]) == len(names)
    pp = Plan(pp=2, gbs=2, seq_len=16)
    first, last = rank_shapes(spec, pp)
    in_first = [n for n in names if n.startswith("tok_embeddings") or any(n.startswith(f"layers.{i}.")
                                                                          for i in range(spec.layers // 2))]
    assert param_tensors(spec, pp, first) == len(in_first)
    assert param_tensors(spec, pp, last) == len(names) - len(in_first)


def test_optimizer_step_runs_at_the_measured_optimizer_rate():
    """A device file with ``memory.optimizer_tbps`` (written by calibrate) times the
    optimizer step at that rate, in the cost model's 34 bytes per local parameter; without
    it, at the element-wise bandwidth (every built-in device)."""
    from dataclasses import replace
    cluster = hand_cluster(2, 2)
    plan = Plan(dp=2, gbs=2, seq_len=1024, zero=1)
    dense = 4 * HAND.layer_kind_params(False) + 2 * 32000 * 1024 + 1024
    assert estimate_step_time(HAND, cluster, plan).parts["optimizer step"] == pytest.approx(34 * dense / 2 / HBM,
                                                                                           rel=1e-12)
    fast = Cluster(device=replace(cluster.device, optimizer_tbps=2.0), devices_per_node=2, nodes=1)
    assert estimate_step_time(HAND, fast, plan).parts["optimizer step"] == pytest.approx(34 * dense / 2 / 2e12,
                                                                                        rel=1e-12)


def test_per_tensor_broadcasts_pay_the_measured_broadcast_latency():
    """With a calibrated broadcast fit, each further parameter tensor of Partita's zero 1
    costs that fit's per-call latency (one binomial-tree step on 2 ranks), not the
    all-gather's: 38 further tensors of the hand model at 100 us = 3.8 ms."""
    from dataclasses import replace

    from partita.spec.collective_fits import CollectiveFit
    base = hand_cluster(2, 2)
    plan = Plan(dp=2, gbs=2, seq_len=1024, zero=1, framework="partita")
    gather = CollectiveFit("all_gather", 2, 400e-6, 1e10)
    without = Cluster(device=replace(base.device, collective_fits=(gather,)), devices_per_node=2, nodes=1)
    with_bc = Cluster(device=replace(base.device, collective_fits=(gather, CollectiveFit("broadcast", 2, 100e-6, 1e10))),
                      devices_per_node=2, nodes=1)
    sync = [estimate_step_time(HAND, c, plan).parts["dp gradient sync"] for c in (without, with_bc)]
    assert sync[0] - sync[1] == pytest.approx(38 * (400e-6 - 100e-6), rel=1e-9)
