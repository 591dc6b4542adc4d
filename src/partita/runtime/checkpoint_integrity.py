"""Checking a checkpoint before trusting it: files against the manifest, tensors finite.

The functions whose docstring says *collective* are called by all ranks of the default
process group, and all get the same answer (the per-rank results are combined with
``all_gather_object``, or an all-reduce of a flag when no rank has anything to report),
so no rank goes on with a checkpoint another rank rejected.

File verification is split across ranks: the manifest's files are dealt out largest
first to the least-loaded rank (the LPT rule, Graham 1969, "Bounds on multiprocessing
timing anomalies"), so the ranks read and checksum disjoint shares in parallel and the
slowest share is at most 4/3 of the ideal.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from .checkpoint_finite import _local, nonfinite_tensors
from .checkpoint_storage import available, file_digest, record_algorithm

CORRUPT_PREFIX = "corrupt-"
Report = Callable[[str], None]


def _rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(value) -> list:
    """``value`` of every rank, in rank order (a plain list without a process group)."""
    rank, world = _rank_world()
    if world == 1:
        return [value]
    out: list = [None] * world
    dist.all_gather_object(out, value)
    return out


def _flag_device() -> torch.device:
    """Where a collective's tensor must live: the CPU for gloo, else the current accelerator
    (nccl, hccl), found without naming a device type."""
    if dist.get_backend() == "gloo":
        return torch.device("cpu")
    acc = torch.accelerator.current_accelerator()
    return torch.device(acc.type, torch.accelerator.current_device_index()) if acc else torch.device("cpu")


def gather_nonempty(value) -> list:
    """Like :func:`gather`, for values that are empty (falsy) on the common path - no error,
    no problem: one all-reduce of a flag answers that case, and the values are gathered
    (pickled) only when some rank has something to say."""
    _, world = _rank_world()
    if world == 1:
        return [value]
    flag = torch.tensor([1 if value else 0], dtype=torch.int32, device=_flag_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return gather(value) if int(flag.item()) else [value] * world


def share_of_files(files: dict[str, dict], rank: int, world: int) -> list[str]:
    """The names ``rank`` verifies: largest first to the least-loaded rank (ties: lowest rank,
    then name), the same deal on every rank."""
    load = [0] * world
    mine = []
    for name in sorted(files, key=lambda n: (-files[n]["size"], n)):
        r = min(range(world), key=lambda i: (load[i], i))
        load[r] += files[name]["size"]
        if r == rank:
            mine.append(name)
    return mine


def verify_files(path: Path, manifest: dict, names: list[str]) -> list[str]:
    """Problems found in ``names`` of checkpoint ``path`` (size, then hash against the
    manifest), one ``"<file>: <reason>"`` each; empty when all match."""
    problems = []
    for name in names:
        rec = manifest["files"][name]
        algorithm = record_algorithm(rec)
        try:
            st = os.stat(path / name)
        except OSError:
            problems.append(f"{name}: missing")
            continue
        if st.st_size != rec["size"]:
            problems.append(f"{name}: {st.st_size} bytes, manifest says {rec['size']} (truncated or overwritten)")
            continue
        try:
            size, digest = file_digest(path / name, algorithm)
        except OSError as e:
            problems.append(f"{name}: unreadable ({e.strerror or e})")
            continue
        if size != rec["size"] or digest != rec[algorithm]:
            problems.append(f"{name}: checksum mismatch ({algorithm} {digest}, manifest says {rec[algorithm]})")
    return problems


def verify_checkpoint(path: Path, manifest: dict | None, error: str | None = None) -> tuple[list[str], list[str]]:
    """Collective: every rank verifies its share of the files; all ranks get (all problems,
    hash algorithms of the manifest that some rank cannot compute). A rank that could not
    read the manifest passes ``manifest=None`` and its ``error`` - one gather for all, so no
    rank can be left waiting in a collective the others skipped."""
    rank, world = _rank_world()
    missing: list[str] = []
    if manifest is None:
        mine = [error or "manifest unreadable"]
    else:
        used = {record_algorithm(r) for r in manifest["files"].values()}
        missing = sorted(a for a in used if a and not available(a))
        mine = [] if missing else verify_files(Path(path), manifest, share_of_files(manifest["files"], rank, world))
    results = [r for r in gather_nonempty((mine, missing) if mine or missing else None) if r]
    return [p for per_rank, _ in results for p in per_rank], sorted({a for _, m in results for a in m})


def _checked_here(state: dict[str, torch.Tensor], plain_by_rank: list[list[str]] | None = None) -> list[str]:
    """The keys this rank checks. A plain (non-DTensor) tensor under one key holds the same
    values on every rank that has it (replicated by data or tensor parallel; loaded from the
    one copy DCP keeps), so each is checked by one of its holders, dealt round robin from
    every rank's list of plain keys (``plain_by_rank``, gathered here if not given); DTensor
    shards are all checked where they live."""
    rank, world = _rank_world()
    floating = [k for k, t in state.items() if torch.is_tensor(t) and t.is_floating_point()]
    if world == 1:
        return floating
    holders: dict[str, list[int]] = {}
    for r, keys in enumerate(plain_by_rank if plain_by_rank is not None else gather(plain_keys(state))):
        for k in keys:
            holders.setdefault(k, []).append(r)
    mine = {k for i, k in enumerate(sorted(holders)) if holders[k][i % len(holders[k])] == rank}
    return [k for k in floating if isinstance(state[k], DTensor) or k in mine]


def plain_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """Keys of this rank's floating-point tensors that are not DTensors."""
    return [k for k, t in state.items() if torch.is_tensor(t) and t.is_floating_point() and not isinstance(t, DTensor)]


def nonfinite_names(state: dict[str, torch.Tensor], plain_by_rank: list[list[str]] | None = None) -> list[str]:
    """Keys of the floating-point tensors (local shards) this rank checked that hold a NaN or
    an inf; every tensor is checked by some rank. Collective (one gather of key names)
    unless every rank's :func:`plain_keys` are given."""
    keys = _checked_here(state, plain_by_rank)
    return [keys[i] for i in nonfinite_tensors([state[k] for k in keys])]


def quarantine(path: Path, reason: str, report: Report | None) -> Path:
    """Rank 0 renames a damaged checkpoint to ``corrupt-<name>`` (``corrupt-<name>.<k>`` if
    taken) - never deletes it - and reports one line; collective, returns the new path."""
    rank, _ = _rank_world()
    target = None
    error = None
    if rank == 0:
        target = path.with_name(CORRUPT_PREFIX + path.name)
        k = 1
        while target.exists():
            target = path.with_name(f"{CORRUPT_PREFIX}{path.name}.{k}")
            k += 1
        try:
            os.replace(path, target)
        except OSError as e:
            error = f"could not rename it ({e.strerror or e}); left as is"
            target = path
        if report:
            where = f"renamed to {target.name}" if error is None else error
            report(f"partita: warning: checkpoint {path} is damaged: {reason}; {where}")
    return Path(gather(str(target) if rank == 0 else None)[0])
