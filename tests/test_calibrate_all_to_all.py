"""Calibrate times the all-to-all as expert parallelism issues it (issue 33 item 7): every timed
call right after the exchange of per-expert token counts, as
:func:`partita.runtime.expert_parallel.exchange` runs its dispatch.

Oracle: the calls themselves, recorded by a wrapper written here around
``torch.distributed.all_to_all_single`` (dtype and element count of each call, in order), once
while calibrate times the collective and once while the runtime's own ``exchange`` dispatches
tokens to experts: the runtime issues an ``int64`` count exchange right before its tokens'
all-to-all, and calibrate must issue the same before every call it times. Nothing is asserted
about how fast anything is.

This file is also the worker (``python tests/test_calibrate_all_to_all.py STORE OUT``): one gloo
process (world 1), so the test stays cheap.
"""
import json
import os
import subprocess
import sys


def _worker(store: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    from partita.calibrate import measure
    from partita.runtime.expert_parallel import exchange
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    log: list[list] = []
    real = dist.all_to_all_single

    def recording(output, input, *args, **kwargs):
        log.append([str(input.dtype), input.numel()])
        return real(output, input, *args, **kwargs)
    dist.all_to_all_single = recording
    cpu = torch.device("cpu")
    # the runtime: 6 tokens of width 4 routed to 2 local experts (counts 4 and 2), world 1
    tokens = torch.randn(6, 4)
    exchange(tokens, [4, 2], dist.group.WORLD, 1, 2, lambda t, per_expert: t * 2)
    runtime = list(log)
    # calibrate: three timed calls of a 4 KiB all-to-all, as measure_collectives times it
    log.clear()
    before = measure._after_count_exchange(dist.group.WORLD, cpu, measure._gap(cpu, lambda: None))
    op = measure._collective_ops(dist.group.WORLD, 4096, cpu)["all_to_all"]
    measure.measure_collective(op, cpu, lambda: None, 1, 3, before)
    calibrate = list(log)
    log.clear()
    rows = measure.measure_collectives(cpu, lambda: None, 1)
    after = {r["kind"]: r["after"] for r in rows}
    with open(out, "w") as f:
        json.dump({"runtime": runtime, "calibrate": calibrate, "after": after}, f)
    dist.destroy_process_group()


def test_calibrate_issues_the_count_exchange_before_every_timed_all_to_all(tmp_path):
    out, store = tmp_path / "out.json", tmp_path / "store"
    proc = subprocess.run([sys.executable, __file__, str(store), str(out)], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    # the runtime's dispatch: the counts (int64, one per global expert), then the tokens (fp32);
    # the combine after the experts: the tokens back
    runtime = got["runtime"]
    assert runtime[0][0] == "torch.int64" and runtime[1][0] == "torch.float32", runtime
    # calibrate: the warm-up call, then per timed call a count exchange right before it
    calibrate = got["calibrate"]
    assert calibrate[0] == ["torch.float32", 1024], calibrate
    timed = calibrate[1:]
    assert len(timed) == 6, calibrate
    for count, call in zip(timed[0::2], timed[1::2]):
        assert count[0] == runtime[0][0] and call == ["torch.float32", 1024], calibrate
    assert got["after"]["all_to_all"] == "compute, then the count exchange"
    assert got["after"]["broadcast"] == "the previous call" and got["after"]["all_reduce"] == "compute"


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
