"""Bind each rank of a CPU run to its own cores (``partita train --bind-cores``, and
calibrate's micro-runs under the same flag): :func:`bind_cores`."""
from __future__ import annotations

import os

from ..errors import PartitaError

#: ``partita train --bind-cores`` reaches the workers through this variable (set by cli/train.py)
BIND_CORES_ENV = "PARTITA_BIND_CORES"


def bind_cores(device_type: str, mode: str | None = None) -> list[int] | None:
    """Pin this rank to its own share of the cores it may run on (``--bind-cores``): ``on``
    always on a CPU device, ``auto`` when the node's ranks are no more than its cores, ``off``
    never. The cores this process may use (``os.sched_getaffinity``) are split into
    ``LOCAL_WORLD_SIZE`` contiguous slices, rank ``LOCAL_RANK`` taking slice ``LOCAL_RANK``, as
    DeepSpeed's ``--bind_cores_to_rank`` splits them (deepspeed/utils/numa.py,
    ``get_numactl_cmd``: ``cores_per_rank = len(cores) // num_local_procs``); with more ranks
    than cores each rank gets one core, ranks sharing them round-robin. Why: on a CPU device
    the kernel's scheduler moves two ranks between two cores and each move costs the rank its
    caches (docs/calibrate.md, "Binding ranks to cores", for what it changed on a 2-vCPU VM).
    An accelerator's host threads are left to the user's own launcher flags (numactl,
    ``taskset``): Partita does not know the host's NUMA layout there. Returns the cores bound
    to, or None when nothing was done."""
    mode = (mode if mode is not None else os.environ.get(BIND_CORES_ENV, "off")).lower()
    if mode not in ("on", "auto", "off"):
        raise PartitaError(f"--bind-cores {mode!r}: use on, auto or off")
    if mode == "off" or device_type != "cpu" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if mode == "auto" and local_world > len(cores):
        return None
    per_rank = max(1, len(cores) // local_world)
    start = (local_rank * per_rank) % len(cores)
    mine = cores[start:start + per_rank]
    os.sched_setaffinity(0, mine)
    return mine
