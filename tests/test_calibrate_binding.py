"""``--bind-cores``: each rank of a CPU run pinned to its own slice of the cores (calibrate/binding.py).

Oracles: the slices DeepSpeed's ``--bind_cores_to_rank`` gives (deepspeed/utils/numa.py,
``get_numactl_cmd``: ``cores_per_rank = len(cores) // num_local_procs``, rank ``i`` taking
cores ``[i * cores_per_rank, (i + 1) * cores_per_rank)``), worked by hand; and the kernel's own
answer (``os.sched_getaffinity``) in a child process that bound itself.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from partita.calibrate import binding
from partita.errors import PartitaError


@pytest.fixture
def cores(monkeypatch):
    """A 4-core machine whose binding calls are recorded, not applied (pytest's own affinity stays)."""
    calls: list[list[int]] = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, mask: calls.append(sorted(mask)))
    return calls


@pytest.mark.parametrize("world, rank, mode, expected", [
    (2, 0, "on", [0, 1]), (2, 1, "on", [2, 3]),  # 4 cores // 2 ranks = 2 each
    (4, 3, "auto", [3]),  # one core each
    (3, 2, "on", [2]),  # 4 // 3 = 1 core each; core 3 left unused, as DeepSpeed leaves it
    (6, 5, "on", [1]),  # more ranks than cores: one core each, round-robin (5 mod 4)
    (6, 5, "auto", None),  # auto binds only when every rank can have its own core
    (2, 1, "off", None),
])
def test_bind_slices(cores, monkeypatch, world, rank, mode, expected):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    assert binding.bind_cores("cpu", mode) == expected
    assert cores == ([expected] if expected else [])


def test_accelerators_and_the_default_are_left_alone(cores, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv(binding.BIND_CORES_ENV, raising=False)
    assert binding.bind_cores("cuda", "on") is None and binding.bind_cores("npu", "auto") is None
    assert binding.bind_cores("cpu") is None  # no flag given: off
    monkeypatch.setenv(binding.BIND_CORES_ENV, "on")
    assert binding.bind_cores("cpu") == [0, 1]  # the flag reaches the worker through the variable
    assert cores == [[0, 1]]


def test_bad_mode_is_a_one_line_error(cores):
    with pytest.raises(PartitaError, match="--bind-cores 'sometimes': use on, auto or off"):
        binding.bind_cores("cpu", "sometimes")


def test_the_kernel_reports_the_binding():
    """A child binds itself as rank 1 of 2 and reads its affinity back from the kernel."""
    have = sorted(os.sched_getaffinity(0))
    code = ("import os; from partita.calibrate.binding import bind_cores; "
            "print(bind_cores('cpu', 'on'), sorted(os.sched_getaffinity(0)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}).stdout.split(" [")
    per = max(1, len(have) // 2)
    mine = have[per % len(have): per % len(have) + per]
    assert out[0].strip() == str(mine) and "[" + out[1].strip() == str(mine)
