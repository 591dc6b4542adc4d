"""Re-planning for another world size keeps the global batch and names what changed."""
import pytest

from partita.errors import PartitaError
from partita.plan import Plan, validate
from partita.spec.load import load_model
from partita.train.replan import describe_change, replan


def test_keeps_tp_pp_and_global_batch_when_possible():
    model = load_model("tiny-llama")
    old = Plan(dp=2, tp=2, pp=2, sp=True, mbs=1, gbs=8, seq_len=64)
    new = replan(old, 4, model)
    # tp=2, pp=2 still divide 4 processes: only dp changes, 4 / (2*2) = 1; mbs 1 divides 8
    assert new == Plan(dp=1, tp=2, pp=2, sp=True, mbs=1, gbs=8, seq_len=64)
    assert not validate(new, model, 4)
    assert describe_change(old, new) == "dp 2->1"


def test_shrinks_model_parallelism_that_no_longer_fits():
    model = load_model("tiny-llama")
    old = Plan(dp=1, tp=4, gbs=8, mbs=2, seq_len=64, sp=True)
    new = replan(old, 2, model)
    # The one right answer: tp=4 cannot divide 2 processes, so tp shrinks to the largest
    # degree below it that divides the new world (2; tiny-llama's 4 heads / 2 KV heads
    # allow it) - keeping tp as large as allowed keeps per-device weights as small as
    # they can be. pp stays 1, dp fills the rest: 2 / (2*1) = 1; the per-replica batch
    # is 8 / 1 = 8 and the old micro-batch 2 divides it, so mbs stays 2 (4 micro-batches);
    # sp stays on because tp > 1.
    assert new == Plan(dp=1, tp=2, pp=1, gbs=8, mbs=2, seq_len=64, sp=True)
    assert not validate(new, model, 2)
    assert describe_change(old, new) == "tp 4->2"


def test_impossible_is_a_clear_error():
    with pytest.raises(PartitaError, match="no plan keeps global batch 3"):
        replan(Plan(dp=1, gbs=3, mbs=1), 2)
