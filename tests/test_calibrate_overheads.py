"""The tp-without-sp framework field (issue 22): a file that sets it moves only the
plans with tp > 1 and no sequence parallelism, by the field times layers x micro-batches
(DTensor's host work is paid once per layer forward + backward); a file without it
(every built-in device, and calibrated files written before the field existed) keeps
``tp_framework_us_per_layer`` for those plans, so their estimates are unchanged."""
import pytest

from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

MODEL = load_model("tiny-llama")  # 4 layers


def step(text: str, **eff) -> float:
    plan = Plan.parse(text, world_size=2, defaults={"gbs": 2, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    return estimate(MODEL, make_cluster("cpu", 2, overrides={"efficiency": eff} if eff else None), plan).step_time_s


@pytest.mark.parametrize("text, moved", [("tp=2", False), ("tp=2,sp=false", True), ("dp=2", False)])
def test_the_no_sp_field_moves_only_tp_without_sp(text, moved):
    with_tp = step(text, tp_framework_us_per_layer=1000.0)
    both = step(text, tp_framework_us_per_layer=1000.0, tp_nosp_framework_us_per_layer=3000.0)
    # tp=2 on 2 ranks with gbs 2, mbs 1: 2 micro-batches of 4 layers
    assert both - with_tp == pytest.approx((2 * 4 * 2e-3) if moved else 0.0, abs=1e-12)


def test_without_the_field_tp_without_sp_keeps_the_tp_field():
    one = step("tp=2,sp=false", tp_framework_us_per_layer=1000.0)
    two = step("tp=2,sp=false", tp_framework_us_per_layer=2000.0)
    assert two - one == pytest.approx(2 * 4 * 1e-3, rel=1e-9)


MOE = load_model("tiny-moe")  # 4 MoE layers


def moe_step(text: str, **eff) -> float:
    plan = Plan.parse(text, world_size=2, defaults={"gbs": 4, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    return estimate(MOE, make_cluster("cpu", 2, overrides={"efficiency": eff} if eff else None), plan).step_time_s


@pytest.mark.parametrize("text", ["ep=2", "dp=2"])
def test_without_the_moe_term_the_ep_term_is_paid_by_every_moe_layer(text):
    """A file without ``moe_framework_us_per_layer`` (built-in devices, calibrated files
    written before it) keeps the earlier reading: the ep run's dispatch charged to every
    MoE layer, with or without ep. 2 ranks, gbs 4, mbs 1: 2 micro-batches of 4 MoE layers,
    once per layer forward + backward."""
    base = moe_step(text)
    charged = moe_step(text, ep_framework_us_per_layer=1000.0)
    assert charged - base == pytest.approx(2 * 4 * 1e-3, rel=1e-9)


def test_a_dense_model_pays_no_expert_dispatch():
    assert step("dp=2", ep_framework_us_per_layer=1000.0) == step("dp=2")


def moe_parts(text: str, **eff) -> dict[str, float]:
    plan = Plan.parse(text, world_size=2, defaults={"gbs": 4, "seq_len": 64, "mbs": 1, "dtype": "fp32"})
    return dict(estimate(MOE, make_cluster("cpu", 2, overrides={"efficiency": eff} if eff else None), plan).time.parts)


@pytest.mark.parametrize("text, per_layer_ms, a2a_ms", [("dp=2", 1.0, 0.0), ("ep=2", 1.0 + 3.0, 3.0)])
def test_a_local_moe_layer_pays_the_moe_term_and_ep_adds_its_own_on_top(text, per_layer_ms, a2a_ms):
    """By hand: 2 ranks, gbs 4, mbs 1 -> 2 micro-batches per rank, 4 MoE layers, each
    field once per layer forward + backward. moe 1 ms, ep 3 ms: dp=2 pays 2 x 4 x 1 ms
    = 8 ms (all of it compute: the ep field is not charged without ep); ep=2 pays
    2 x 4 x (1 + 3) ms = 32 ms, of which 2 x 4 x 3 ms = 24 ms under the ep all-to-all."""
    base = moe_parts(text)
    charged = moe_parts(text, moe_framework_us_per_layer=1000.0, ep_framework_us_per_layer=3000.0)
    assert sum(charged.values()) - sum(base.values()) == pytest.approx(2 * 4 * per_layer_ms * 1e-3, rel=1e-9)
    assert charged["compute"] - base["compute"] == pytest.approx(2 * 4 * 1e-3, rel=1e-9)
    assert charged.get("ep all-to-all", 0.0) - base.get("ep all-to-all", 0.0) == pytest.approx(
        2 * 4 * a2a_ms * 1e-3, abs=1e-12)


def test_with_the_moe_term_set_the_ep_term_no_longer_reaches_dp_only_moe_plans():
    """tiny-moe dp2 was over-predicted (+127 %) when the ep run's whole dispatch was charged
    to it: once the moe field is set, the ep field moves only ep plans."""
    one = moe_step("dp=2", moe_framework_us_per_layer=500.0, ep_framework_us_per_layer=1000.0)
    two = moe_step("dp=2", moe_framework_us_per_layer=500.0, ep_framework_us_per_layer=9000.0)
    assert one == two
    assert moe_step("ep=2", moe_framework_us_per_layer=500.0, ep_framework_us_per_layer=9000.0) - \
        moe_step("ep=2", moe_framework_us_per_layer=500.0, ep_framework_us_per_layer=1000.0) == \
        pytest.approx(2 * 4 * 8e-3, rel=1e-9)


def test_a_dense_model_pays_no_moe_term():
    assert step("dp=2", moe_framework_us_per_layer=1000.0) == step("dp=2")
