"""Held-out eval loss has one definition on every layout: the language-model loss (mean token
cross-entropy), without the MoE load-balancing (aux) loss - Megatron reports "lm loss" apart
from the aux losses. A tiny MoE model evaluated under a pipeline (pp=2: the schedule's
forward-only ``eval``, where MoE layers record their aux losses for the training loss) and
without one (dp=2) gives the loss of a plain single-process forward of the same weights;
the aux loss is large enough there that adding it would fail the comparison. The cases run
in the session's shared 2-process gloo torchrun (tests/conftest.py ``equivalence``), this
file's :func:`run_case`."""
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

CASES = ["pp=2", "dp=2"]
SEQ, ROWS = 16, 8  # two global batches of gbs=4
EQUIVALENCE_CASES = [(2, 0, case, str(Path(__file__).resolve())) for case in CASES]


def _rows() -> tuple:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (ROWS, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def run_case(text: str) -> dict:
    """``text``'s layout of tiny-moe evaluated with ``partita.train.evaluate.evaluate`` on two
    global batches; rank 0 adds a single-process forward's mean loss and its aux loss."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from partita.models.llama import build_model
    from partita.plan import Plan
    from partita.runtime.batches import dp_shard
    from partita.runtime.parallelize import parallelize
    from partita.train.evaluate import evaluate
    plan = Plan.parse(f"{text},dtype=fp32,gbs=4,mbs=1,seq_len={SEQ}", world_size=dist.get_world_size())
    pm = parallelize(build_model("tiny-moe", seed=0), plan, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
    x, y = _rows()
    batches = [(dp_shard(x[b:b + 4], plan, dist.get_rank()), dp_shard(y[b:b + 4], plan, dist.get_rank()))
               for b in range(0, ROWS, 4)]
    result = {"eval_loss": evaluate(pm, batches)}
    if dist.get_rank() == 0:  # the oracle: every row's own forward, plain cross-entropy, averaged
        model = build_model("tiny-moe", seed=0).eval()
        losses, aux = [], []
        with torch.no_grad():
            for i in range(ROWS):
                losses.append(float(F.cross_entropy(model(x[i:i + 1]).flatten(0, 1), y[i])))
                aux.append(float(model.aux_loss()))
        result.update(oracle=sum(losses) / ROWS, aux=sum(aux) / ROWS)
    return result


@pytest.fixture(scope="module")
def results(equivalence):
    return {spec[2]: equivalence["results"][spec] for spec in EQUIVALENCE_CASES}


@pytest.mark.parametrize("case", CASES)
def test_moe_eval_loss_is_the_lm_loss_on_every_layout(results, case):
    r = results[case]
    assert r["aux"] > 1e-3  # the aux loss would show: adding it would miss the oracle by far more than 1e-5
    assert abs(r["eval_loss"] - r["oracle"]) <= 1e-5, r


def test_pipeline_and_plain_eval_losses_are_equal(results):
    assert abs(results["pp=2"]["eval_loss"] - results["dp=2"]["eval_loss"]) <= 1e-5, results
