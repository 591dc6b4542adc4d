"""Resume from the newest checkpoint that passes every check, never from a damaged one.

:func:`resume_checkpoint` is collective (every rank calls it, all get the same answer):

1. rank 0 lists ``root`` (:func:`scan_checkpoints`) and broadcasts the list, so the ranks
   agree on the candidates even if a directory changes meanwhile;
2. directories named ``step_N`` whose completion record is bad (manifest missing,
   unreadable, not matching its own CRC-32, or ``meta.json`` not matching it) are renamed
   ``corrupt-step_N`` with one warning line; unfinished saves (``step_N.partial``) are
   reported and left alone;
3. newest first, each candidate is checked - every file against the manifest, split over
   the ranks (:func:`verify_checkpoint`); the ``.metadata`` readable and its tensors
   matching this model (a different model is the user's mistake, refused with a
   ``PartitaError``, not a damaged checkpoint); the load itself (DCP raises
   ``CheckpointException``, a ``BaseException``, when a file is damaged in a way only
   a load sees, as in checkpoints without a manifest); every loaded model and optimizer
   tensor finite - and the first that passes is the one resumed from. One that fails is
   renamed ``corrupt-step_N`` (never deleted) with one warning line naming the file and
   the reason, and the next newest is tried;
4. if checkpoints existed but none passed, a ``PartitaError`` says so in one line.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ..errors import PartitaError
from .checkpoint import Found, Report, load_checkpoint, one_line, scan_checkpoints, state_for_checkpoint
from .checkpoint_integrity import (CORRUPT_PREFIX, _rank_world, gather, gather_nonempty, nonfinite_names,
                                   plain_keys, quarantine, verify_checkpoint)
from .checkpoint_storage import ALGORITHMS, MANIFEST, ManifestError, read_manifest


def _say(report: Report | None, msg: str) -> None:
    if report and _rank_world()[0] == 0:
        report(msg)


def _fit_problems(state: dict[str, torch.Tensor], path: Path) -> tuple[str | None, str | None, set[str]]:
    """(damage, mismatch, the checkpoint's model keys) seen by this rank: ``.metadata``
    unreadable -> damage; a tensor of this model missing from the checkpoint or of another
    shape -> mismatch."""
    try:
        md = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception as e:  # noqa: BLE001 - unpickling garbage raises anything
        return f".metadata: unreadable ({type(e).__name__})", None, set()
    theirs = {n for n in md if n.startswith("model.")}
    for name, t in state.items():
        entry = md.get(name)
        if entry is None:
            return None, f"{name} is not in the checkpoint", theirs
        shape = tuple(t.shape)  # a DTensor's shape is the global one, as DCP records it
        if isinstance(entry, TensorStorageMetadata) and tuple(entry.size) != shape:
            return None, f"{name} has shape {list(entry.size)} in the checkpoint, {list(shape)} in this model", theirs
    return None, None, theirs


def _check_fit(pm, path: Path) -> tuple[str | None, list[list[str]]]:
    """Collective: (a damage reason or None, every rank's plain tensor keys for the finite
    check); raises ``PartitaError`` (on every rank) if the checkpoint is intact but holds
    another model. Decided from gathered results only, so every rank takes the same branch."""
    state = state_for_checkpoint(pm, init_optimizer=True)
    damage, mismatch, theirs = _fit_problems(state, path)
    ours = {n for n in state if n.startswith("model.")}
    results = gather((damage, mismatch, theirs, ours, plain_keys(state)))
    plain_by_rank = [r[4] for r in results]
    damages = [r[0] for r in results if r[0]]
    if damages:
        return damages[0], plain_by_rank
    mismatches = [r[1] for r in results if r[1]]
    extra = sorted(results[0][2] - set().union(*(r[3] for r in results)))
    if not mismatches and extra:
        mismatches = [f"{extra[0]} is in the checkpoint but not in this model"]
    if mismatches:
        raise PartitaError(f"checkpoint {path} holds another model or optimizer than this run's: {mismatches[0]}")
    return None, plain_by_rank


def _files_problem(found: Found, report: Report | None) -> str | None:
    """Collective: the first file problem against the manifest, or None (a legacy checkpoint,
    without manifest, is loaded unverified, with a note)."""
    if found.kind == "legacy":
        _say(report, f"partita: note: {found.path} has no {MANIFEST} (written before integrity checks); "
                     "loading it without verifying its files")
        return None
    try:
        manifest, error = read_manifest(found.path), None
    except ManifestError as e:
        manifest, error = None, str(e)
    problems, missing = verify_checkpoint(found.path, manifest, error)
    if missing:  # not damage, only unverifiable here: stop with one line, rename nothing
        package = ALGORITHMS[missing[0]]
        raise PartitaError(f"checkpoint {found.path} was checksummed with {missing[0]}, which needs the {package} "
                           f"package to verify: pip install {package}")
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def try_checkpoint(pm, found: Found, report: Report | None = None) -> tuple[dict | None, str | None]:
    """Collective: verify and load checkpoint ``found`` into ``pm``; (meta, None) when it
    passed, (None, reason) when it is damaged (``pm`` may then hold part of it: load
    another one before training)."""
    path = found.path
    problem = _files_problem(found, report)
    if problem:
        return None, problem
    problem, plain_by_rank = _check_fit(pm, path)
    if problem:
        return None, problem
    try:
        meta, error = load_checkpoint(pm, path), None
    except (CheckpointException, OSError, ValueError) as e:
        meta, error = None, f"load failed: {one_line(e)}"
    bad = nonfinite_names(state_for_checkpoint(pm), plain_by_rank)  # every rank, whatever the load did
    if error is None and bad:
        error = f"{bad[0]} is not finite after loading (NaN or inf)"
    errors = [e for e in gather_nonempty(error) if e]
    if errors:
        return None, errors[0]
    return meta, None


def _listing(root: Path) -> list[Found]:
    """Rank 0's view of ``root``, the same on every rank."""
    rank, _ = _rank_world()
    return gather(scan_checkpoints(root) if rank == 0 else None)[0]


def resume_checkpoint(pm, root: str | Path, report: Report | None = None) -> tuple[int, Path, dict] | None:
    """Collective: load the newest checkpoint under ``root`` that passes every check into
    ``pm``; returns (step, path, meta), or None when ``root`` holds no checkpoint at all.
    Damaged ones are renamed ``corrupt-<name>``; raises ``PartitaError`` when none passes."""
    root = Path(root)
    damaged = []
    candidates = []
    for f in _listing(root):
        if f.kind == "partial":
            _say(report, f"partita: skipping damaged or partial checkpoint {f.path}: {f.reason}")
        elif f.kind == "damaged":
            damaged.append(quarantine(f.path, f.reason, report))
        else:
            candidates.append(f)
    for f in reversed(candidates):
        meta, reason = try_checkpoint(pm, f, report)
        if reason is None:
            return f.step, f.path, meta
        damaged.append(quarantine(f.path, reason, report))
    earlier = root.exists() and any(p.name.startswith(CORRUPT_PREFIX) for p in root.iterdir())
    if damaged or earlier:
        raise PartitaError(f"no usable checkpoint in {root}: every checkpoint there is damaged "
                           f"({len(damaged)} renamed {CORRUPT_PREFIX}* now); resume is impossible, "
                           "start without --resume or restore a copy")
    return None


def newest_verified_checkpoint(root: str | Path, report: Report | None = None) -> tuple[int, Path] | None:
    """Collective, without loading: (step, path) of the newest checkpoint whose files all
    match its manifest; damaged ones are renamed as in :func:`resume_checkpoint`. Legacy
    checkpoints (no manifest) are not returned: nothing can vouch for them without a load."""
    root = Path(root)
    for f in reversed(_listing(root)):
        if f.kind == "damaged":
            quarantine(f.path, f.reason, report)
        elif f.kind == "verified":
            problem = _files_problem(f, report)
            if problem is None:
                return f.step, f.path
            quarantine(f.path, problem, report)
    return None
