"""Re-planning for another world size keeps the global batch and names what changed."""
import pytest

from partita.errors import PartitaError
from partita.plan import Plan, validate
from partita.spec.model import load_model
from partita.train.replan import describe_change, replan


def test_keeps_tp_pp_and_global_batch_when_possible():
    model = load_model("tiny-llama")
    old = Plan(dp=2, tp=2, pp=2, sp=True, mbs=1, gbs=8, seq_len=64)
    new = replan(old, 4, model)
    assert (new.tp, new.pp, new.dp, new.gbs) == (2, 2, 1, 8)
    assert not validate(new, model, 4)
    assert describe_change(old, new) == "dp 2->1"


def test_shrinks_model_parallelism_that_no_longer_fits():
    model = load_model("tiny-llama")
    new = replan(Plan(dp=1, tp=4, gbs=8, mbs=2, seq_len=64, sp=True), 2, model)
    assert new.world_size == 2 and new.gbs == 8 and new.tp in (1, 2)
    assert not validate(new, model, 2)


def test_impossible_is_a_clear_error():
    with pytest.raises(PartitaError, match="no plan keeps global batch 3"):
        replan(Plan(dp=1, gbs=3, mbs=1), 2)
