"""Issue 17, runtime side: each communication knob trains on 2 gloo ranks like single-process
training (within the stated tolerance), sends the bytes recorded in
tests/data/compression_oracle.json (which the planning tests compare with the cost model),
and PowerSGD's state survives a checkpoint resume. Every case runs in the session's shared
2-rank equivalence processes (tests/conftest.py ``equivalence``;
tests/compression_worker.py's ``shared_case``), not in a torchrun of its own."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from compression_worker import BYTES, EQUIVALENCE  # noqa: E402  (tests/compression_worker.py, after torch)

HERE = Path(__file__).parent
ORACLE = json.loads((HERE / "data" / "compression_oracle.json").read_text())["bytes"]
#: (loss relative, parameter absolute) differences from the single-process fp32 reference after
#: 5 steps of SGD + momentum. fp32 knobs (bucket size, prefetch) only reorder float32 sums
#: (measured <= 5e-8 / 1.2e-8). bf16 autocast alone measured 2.3e-5 / 8.2e-5; reducing the
#: gradients in bf16 (2^-8 relative rounding per element, once per step) measured
#: 2.2e-5 / 1.6e-4 - asserted 1e-3 / 5e-3, the bf16 bound of test_runtime_equivalence.
#: PowerSGD rank 4 is lossy by design (rank-4 approximation from step 2, error feedback
#: recovers the rest later): measured 2.6e-4 / 8.2e-3 - asserted 5e-3 / 5e-2.
TOLERANCE = {"fp32": (1e-6, 1e-6), "bf16": (1e-3, 5e-3), "powersgd": (5e-3, 5e-2)}


WORKER = str(HERE / "compression_worker.py")
#: the worker's cases (tests/compression_worker.py EQUIVALENCE, BYTES, resume), as its shared_case names them
EQUIVALENCE_CASES = [(2, 0, f"{kind}|{name}", WORKER) for kind, names in (("equivalence", EQUIVALENCE), ("bytes", BYTES))
                     for name in names] + [(2, 0, "resume", WORKER)]


@pytest.fixture(scope="module")
def results(equivalence) -> dict:
    """{"equivalence": {plan: result}, "bytes": {knob: result}, "resume": result}: what the
    worker's ``main`` writes, gathered from the session's shared processes."""
    out: dict = {"equivalence": {}, "bytes": {}}
    for spec in EQUIVALENCE_CASES:
        kind, _, name = spec[2].partition("|")
        if kind == "resume":
            out["resume"] = equivalence["results"][spec]
        else:
            out[kind][name] = equivalence["results"][spec]
    return out


def _kind(case: str) -> str:
    return "powersgd" if "powersgd" in case else "bf16" if "dtype=bf16" in case else "fp32"


def test_knobs_train_like_one_process(results):
    for case, r in results["equivalence"].items():
        loss_tol, param_tol = TOLERANCE[_kind(case)]
        assert r["loss_rel_diff"] <= loss_tol, (case, r["loss_rel_diff"])
        assert r["param_abs_diff"] <= param_tol, (case, r["param_abs_diff"])


def test_powersgd_really_compresses(results):
    """A PowerSGD run that silently all-reduced the full gradients would match the reference
    to float32 rounding; rank-4 compression must move the parameters measurably."""
    r = next(v for k, v in results["equivalence"].items() if "powersgd" in k)
    assert r["param_abs_diff"] > 1e-4


def test_bytes_sent_are_the_recorded_oracle(results):
    """Keeps tests/data/compression_oracle.json current: the bytes each knob sends per step."""
    for knob, recorded in ORACLE.items():
        live = results["bytes"][knob]
        for coll, entry in recorded["per_step"].items():
            assert live["per_step"][coll]["bytes"] == pytest.approx(entry["bytes"], rel=1e-6), (knob, coll)
        assert live["powersgd_state_numel"] == recorded["powersgd_state_numel"], knob


def test_powersgd_resume_equals_uninterrupted_run(results):
    r = results["resume"]
    tail = r["uninterrupted"][5:]
    assert max(abs(a - b) for a, b in zip(r["resumed"], tail)) <= 1e-5
    assert r["resumed_iter"] == 8
    # control: without its PowerSGD state the resumed run departs from the uninterrupted one
    assert max(abs(a - b) for a, b in zip(r["resumed_without_powersgd_state"], tail)) > 1e-4


def test_powersgd_refused_where_no_comm_hook_exists():
    code = ("import torch.distributed as dist, os;"
            "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='29561', RANK='0', WORLD_SIZE='1');"
            "dist.init_process_group('gloo');"
            "from partita.runtime.compression import apply_comm_knobs; from partita.plan import Plan;"
            "from partita.errors import PartitaError\n"
            "try:\n apply_comm_knobs([], Plan(dp=2, zero=0, tp=2, grad_compression='powersgd'), object(), None)\n"
            "except PartitaError as e: print('REFUSED', e)\n"
            "dist.destroy_process_group()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "REFUSED plan not runnable: grad_compression=powersgd needs plain DDP" in proc.stdout, proc.stderr


def test_profile_counter_measures_the_predicted_dp_bytes_per_knob(results):
    """partita profile's collective counter (partita.profile.collective_counter), run on the same processes for
    every knob: the gradient bytes it counts agree with the cost model's prediction within 10%
    (issue 17's done-when), and where the profiler trace sees every call (all knobs but
    PowerSGD, whose P/Q all-reduces run in callbacks the trace misses) the counter equals the
    trace's bytes (gloo's own record of each call's buffer) - an oracle outside both the counter and the cost model."""
    from partita.plan import Plan
    from partita.profile.dp_bytes import GRADIENT_COLLECTIVES, compare_dp_bytes
    from partita.spec.load import load_model
    model = load_model("tiny-llama")
    for knob, r in results["bytes"].items():
        plan = Plan.from_dict(r["plan"])
        section = compare_dp_bytes([{"dp_wire": r["dp_wire"]}], plan, model)
        assert section["steps"] == 3, knob
        assert abs(section["ratio_measured_over_predicted"] - 1) <= 0.10, (knob, section)
        if "powersgd" not in knob and plan.zero == 0:  # zero 3: gloo runs FSDP2's reduce-scatter
            # as an all-reduce whose traced buffer is 156 B (39 elements) larger than the one
            # FSDP2 hands to torch.distributed (not investigated; 0.01 %)
            traced = sum(r["per_step"].get(coll, {}).get("bytes", 0.0) for coll in GRADIENT_COLLECTIVES)
            assert section["measured_gradient_bytes"] == pytest.approx(traced, rel=1e-9), knob
    fp32 = results["bytes"]["none"]["dp_wire"]["by_collective"]["all_reduce"]["bytes"]
    assert results["bytes"]["bf16"]["dp_wire"]["by_collective"]["all_reduce"]["bytes"] < 0.51 * fp32
    assert results["bytes"]["powersgd-r4"]["dp_wire"]["by_collective"]["all_reduce"]["bytes"] < 0.2 * fp32
