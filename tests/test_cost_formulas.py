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


def test_model_states_by_zero_stage():
    p = Plan(dp=8, zero=0)
    assert model_state_bytes(p, 1e9, 8) == {"weights": 2e9, "gradients": 4e9, "optimizer": 12e9}
    z1 = model_state_bytes(Plan(dp=8, zero=1), 1e9, 8)
    assert z1["optimizer"] == pytest.approx(12e9 / 8) and z1["gradients"] == 4e9
    z3 = model_state_bytes(Plan(dp=8, zero=3), 1e9, 8)
    assert sum(z3.values()) == pytest.approx(16e9 / 8)  # fp32 param is the master copy


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
    from partita.spec.model import load_model
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
