"""DualPipeV in the runtime: ``partita.parallelize`` builds torch's ``ScheduleDualPipeV`` with
the V placement (rank 0: chunks 0 and 3, rank 1: chunks 1 and 2, pp=2) and trains like
single-process training of the same model and data - 3 steps of SGD with momentum, every
rank's losses, parameters and momentum buffers against the single-process reference
(``partita.runtime.equivalence``). The cases run in the session's shared 2-process torchrun
with the other equivalence cases (tests/conftest.py), so they add no process group start."""

from pathlib import Path

import pytest

S = "gbs=4,mbs=1,seq_len=16"  # 4 micro-batches: DualPipeV's minimum 2*pp
CASES = [
    "tiny-llama:pp=2,schedule=dualpipev," + S,  # vpp 2 implied by the schedule
    "tiny-moe:pp=2,schedule=dualpipev,gbs=5,mbs=1,seq_len=16",  # odd micro-batch count; MoE aux losses
]
STEPS = 3
WORKER = Path(__file__).with_name("dualpipev_worker.py")  # eval through the pipeline, what was built
EVAL = "tiny-llama:pp=2,schedule=dualpipev," + S
EQUIVALENCE_CASES = [(2, STEPS, case) for case in CASES] + [(2, 0, EVAL, str(WORKER))]


@pytest.mark.parametrize("case", CASES)
def test_dualpipev_matches_single_process(equivalence, case):
    r = equivalence["results"][(2, STEPS, case)]
    assert "dualpipev" in r["plan"]  # the plan the run built (its summary)
    assert len(r["losses"]) == STEPS and r["losses"][0] != r["losses"][-1]  # it trained
    assert r["loss_rel_diff"] <= 1e-6, r  # float32 rounding only (tests/test_runtime_equivalence.py TOLERANCE)
    assert r["param_abs_diff"] <= 1e-6, r
    assert r["state_abs_diff"] <= 1e-6, r
    assert r["params_compared_rank0"] > 0 and r["state_compared_rank0"] > 0


def test_dualpipev_eval_and_placement(equivalence):
    """torch's ScheduleDualPipeV is what runs, each rank holds its V chunks (rank 0: 0 and 3), and
    the forward-only eval through the pipeline (runtime/pipeline.py DualPipeVSchedule.eval) gives the
    single-process loss of the same batch."""
    r = equivalence["results"][(2, 0, EVAL, str(WORKER))]
    assert r["torch_dualpipev"]
    assert r["stages_per_rank"] == [[0, 3], [1, 2]]
    assert abs(r["eval_loss"] - r["reference"]) <= 1e-6 * abs(r["reference"]), r
