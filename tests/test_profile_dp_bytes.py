"""Issue 17: `partita profile` reports the data-parallel bytes per step that really went over
gloo (counted at each collective call, partita.profile.collective_counter) beside the cost model's
prediction. PowerSGD is the knob the profiler trace cannot see (its P and Q all-reduces run
in future callbacks), so it is the one run end to end here; every knob is checked on shared
processes in tests/test_compression_runtime.py."""
import json
import sys

import pytest

pytest.importorskip("torch")

PLAN = "dp=2,zero=0,dtype=bf16,grad_compression=powersgd,powersgd_rank=4,gbs=4,mbs=1,seq_len=16"


COUNTER_CODE = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
from partita.profile.collective_counter import CollectiveCounter
original = dist.all_reduce
sub = dist.new_group([0])
c = CollectiveCounter().start()
c.set_step(2)
dist.all_reduce(torch.ones(10), dist.ReduceOp.SUM, sub)             # positional group: 40 B
dist.all_reduce(torch.ones(3, dtype=torch.bfloat16), group=sub, async_op=True).wait()  # 6 B
out = torch.empty(4)
dist.all_gather_into_tensor(out, torch.ones(4))                       # world group: 16 B
c.set_step(1)
dist.all_reduce(torch.ones(100), group=sub)                           # before first_step: left out
c.stop()
assert dist.all_reduce is original
print(c.per_step((0,), 2))
dist.destroy_process_group()
"""  # argv[1]: the process group's file store


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """The module's two fresh processes - ``partita profile`` on 2 ranks and the one-process
    counter check (COUNTER_CODE) - independent, started together (tests/conftest.py
    run_together; the profile run's directory goes under runs/ of its own folder)."""
    from conftest import run_together
    tmp = tmp_path_factory.mktemp("dp-bytes")
    profile = [sys.executable, "-m", "partita", "profile", "--model", "tiny-llama", "--plan", PLAN, "--nproc", "2",
               "--steps", "4", "--json", "--timeout-s", "120"]
    counter = [sys.executable, "-c", COUNTER_CODE, str(tmp / "store")]
    return dict(zip(("profile", "counter"), run_together([profile, counter], timeout=300,
                                                          envs=[{"OMP_NUM_THREADS": "1"}] * 2, cwd=tmp)))


def test_profile_reports_measured_dp_bytes_beside_prediction(runs):
    proc = runs["profile"]
    assert proc.returncode == 0, proc.stderr[-4000:]
    section = json.loads(proc.stdout)["dp_bytes"]
    assert section["knob"] == "powersgd-r4" and section["group"] == [0, 1]
    assert section["steps"] == 2  # steps 2 and 3: PowerSGD compresses from step 2
    measured = section["measured_by_collective"]["all_reduce"]
    # per bucket: the uncompressed rank-1 tensors, then P, then Q (torch's powerSGD_hook), plus
    # one loss all-reduce per micro-batch; a run that skipped compression would send 1 per bucket
    assert measured["calls"] >= 5 and measured["seconds"] > 0
    assert abs(section["ratio_measured_over_predicted"] - 1) <= 0.10, section
    # and it really compressed: far below the uncompressed fp32 gradients
    assert section["measured_gradient_bytes"] < 0.2 * section["predicted_fp32_bytes"]


def test_counter_counts_bytes_group_and_async_calls(runs):
    """The counter on one gloo process: bytes are the sent tensors' (numel x element size), the
    group comes from a positional or keyword argument, async calls count when they complete,
    and stop() restores torch.distributed."""
    proc = runs["counter"]  # COUNTER_CODE in a fresh interpreter
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = eval(proc.stdout.strip().splitlines()[-1])
    assert got["all_reduce"]["bytes"] == 46 and got["all_reduce"]["calls"] == 2
    assert got["all_gather"]["bytes"] == 16 and got["all_reduce"]["steps"] == 1
