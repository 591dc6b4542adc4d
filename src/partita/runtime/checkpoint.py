"""Distributed checkpoints that reshard across plans, written atomically.

State is saved with ``torch.distributed.checkpoint`` (DCP) in a *canonical* form that does
not depend on the plan: every model parameter and optimizer state tensor keyed by its
parameter name (``model.<fqn>``, ``optim.<fqn>.<state>``), as DTensors where the plan shards
them (tensor parallel, FSDP, and experts - wrapped as ``Shard(0)`` over the ep group) and
as plain tensors where it replicates them. DCP records each shard's global offsets, so a
checkpoint written under dp=2,tp=2 loads under pp=2,dp=2, dp=4 or one process.

A checkpoint directory is complete only once its manifest (``MANIFEST.json``, see
``checkpoint_storage.py``) exists: files are written into ``step_N.partial/`` with their
size and CRC-32 taken while writing, rank 0 writes ``meta.json`` and then the manifest
(atomically, fsynced) after every rank has finished, then renames the directory to
``step_N/`` (an atomic rename). Checkpoints written before manifests existed carry a
``COMMITTED`` marker instead and are still listed ("legacy"). Resume with verification
and fallback is in ``checkpoint_resume.py``; docs/checkpoints.md says what is checked.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor, Shard

from ..errors import PartitaError
from .checkpoint_integrity import gather, gather_nonempty
from .compression import compression_tensors, load_targets as compression_targets, restore as restore_compression
from . import checkpoint_storage as storage
from .checkpoint_storage import (LEGACY_MARKER, MANIFEST, ChecksummingWriter, FileRecord, ManifestError, NonFiniteState,
                                 available,
                                 build_manifest, check_sizes, fsync_dir, hash_bytes, read_manifest, record_algorithm,
                                 write_bytes_durably)

MARKER = LEGACY_MARKER  # kept for callers of the old name
STEP_DIR = re.compile(r"^step_(\d+)$")
Report = Callable[[str], None]


def _torch_optimizers(opt) -> list[torch.optim.Optimizer]:
    if isinstance(opt, torch.optim.Optimizer):
        return [opt]
    out = []
    for part in getattr(opt, "parts", []):
        out += _torch_optimizers(part)
    inner = getattr(opt, "optimizer", None)
    if inner is not None:
        out += _torch_optimizers(inner)
    return out


def _named_params(pm) -> dict[str, torch.nn.Parameter]:
    out = {}
    for mod in pm.modules:
        for name, p in mod.named_parameters():
            out[name.removeprefix("module.")] = p
    return out


def _ensure_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create the lazily-built state (Adam moments, SGD momentum) so there is something to load into."""
    for group in opt.param_groups:
        for p in group["params"]:
            if opt.state.get(p):
                continue
            if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                "exp_avg_sq": torch.zeros_like(p)}
            elif isinstance(opt, torch.optim.SGD) and group.get("momentum", 0):
                opt.state[p] = {"momentum_buffer": torch.zeros_like(p)}


def _expert_mesh(pm) -> DeviceMesh | None:
    if pm.ep_group is None:
        return None
    return DeviceMesh.from_group(pm.ep_group, pm.device.type)


def _canonical(t: torch.Tensor, expert: bool, mesh: DeviceMesh | None) -> torch.Tensor:
    if expert and mesh is not None and not isinstance(t, DTensor):
        return DTensor.from_local(t.detach(), mesh, [Shard(0)], run_check=False)
    return t.detach() if not isinstance(t, DTensor) else t


def state_for_checkpoint(pm, init_optimizer: bool = False) -> dict[str, torch.Tensor]:
    """The canonical state dict of this rank (tensors share storage with the live ones,
    so ``dcp.load`` into it restores the model and optimizer in place)."""
    mesh = _expert_mesh(pm)
    params = _named_params(pm)
    state: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        state[f"model.{name}"] = _canonical(p.data if not isinstance(p, DTensor) else p, getattr(p, "_partita_expert", False), mesh)
    by_param = {id(p): name for name, p in params.items()}
    for opt in _torch_optimizers(pm.optimizer):
        if init_optimizer:
            _ensure_optimizer_state(opt)
        for p, st in opt.state.items():
            name = by_param.get(id(p))
            if name is None:
                continue
            for key, value in st.items():
                if not torch.is_tensor(value):
                    continue
                if value.dim() == 0:
                    state[f"optim.{name}.{key}"] = value
                else:
                    state[f"optim.{name}.{key}"] = _canonical(value, getattr(p, "_partita_expert", False), mesh)
    return state


def one_line(e: BaseException) -> str:
    """A one-line description of an error; for DCP's ``CheckpointException`` (a
    ``BaseException`` whose text is every rank's traceback) the first failing rank's error."""
    if isinstance(e, CheckpointException) and e.failures:
        rank, (exc, _) = sorted(e.failures.items(), key=lambda kv: kv[0])[0]
        return f"rank {rank}: {one_line(exc)}"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}" + (f": {e.filename}" if e.filename else "")
    text = str(e).strip().splitlines()
    line = f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
    return line if len(line) <= 160 else line[:157] + "..."


def agree(fn: Callable[[], Any], what: str) -> Any:
    """Collective: run ``fn`` on this rank; if it failed on any rank (``OSError``, DCP's
    ``CheckpointException``, ``PartitaError``), raise one ``PartitaError`` on every rank,
    so no rank waits in a collective for one that gave up."""
    out, error = None, None
    try:
        out = fn()
    except PartitaError as e:
        error = str(e)
    except (OSError, CheckpointException) as e:
        error = f"{what}: {one_line(e)}"
    errors = [e for e in gather_nonempty(error) if e]
    if errors:
        raise PartitaError(errors[0])
    return out


@dataclass
class Found:
    """A directory under a checkpoint root: ``kind`` is "verified" (complete manifest),
    "legacy" (``COMMITTED`` marker, written before manifests), "damaged" (a step_N
    directory whose completion record is bad) or "partial" (an unfinished save)."""
    step: int
    path: Path
    kind: str
    reason: str = ""


def _classify(path: Path) -> Found:
    m = STEP_DIR.match(path.name)
    if m is None:
        return Found(-1, path, "partial", "unfinished save (no atomic rename)")
    step = int(m.group(1))
    if (path / MANIFEST).exists() or not (path / LEGACY_MARKER).exists():
        try:
            manifest = read_manifest(path)
        except ManifestError as e:
            return Found(step, path, "damaged", str(e))
        if manifest.get("step") != step:
            return Found(step, path, "damaged", f"{MANIFEST}: says step {manifest.get('step')}")
        rec = manifest["files"].get("meta.json")
        try:
            data = (path / "meta.json").read_bytes()
        except OSError:
            return Found(step, path, "damaged", "meta.json: missing")
        algorithm = record_algorithm(rec) if rec else None
        if algorithm is None or len(data) != rec["size"] or \
                (available(algorithm) and hash_bytes(data, algorithm) != rec[algorithm]):
            return Found(step, path, "damaged", "meta.json: checksum mismatch")
        return Found(step, path, "verified")
    try:
        json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return Found(step, path, "damaged", "unreadable meta.json")
    return Found(step, path, "legacy")


def scan_checkpoints(root: str | Path) -> list[Found]:
    """Every ``step_*`` directory under ``root`` classified (cheap: reads manifests and
    ``meta.json`` only), oldest first; ``corrupt-*`` directories are not listed."""
    root = Path(root)
    if not root.exists():
        return []
    found = [_classify(p) for p in sorted(root.iterdir()) if p.is_dir() and p.name.startswith("step_")]
    return sorted(found, key=lambda f: (f.step, f.path.name))


def complete_checkpoints(root: str | Path, report: Report | None = None) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints under ``root`` (verified and legacy), oldest
    first; ``report`` is called with a message for every directory that looks like a
    checkpoint but is not one. Lists only: nothing is renamed or read beyond manifests."""
    out = []
    for f in scan_checkpoints(root):
        if f.kind in ("verified", "legacy"):
            out.append((f.step, f.path))
        elif report:
            report(f"partita: skipping damaged or partial checkpoint {f.path}: {f.reason}")
    return out


def _prepare(root: Path, partial: Path, report: Report | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if partial.exists():
        if report:
            report(f"partita: removing {partial}, an unfinished save of the same step left by an interrupted run")
        shutil.rmtree(partial)
    partial.mkdir()


def _commit(root: Path, partial: Path, final: Path, step: int, world: int, records: dict[str, FileRecord],
            meta: dict, keep: int) -> None:
    """Rank 0, after every rank has written: meta.json, the manifest (last, atomic), the
    directory rename, then the keep rule."""
    meta = {**meta, "step": step}
    meta_bytes = json.dumps(meta, indent=1).encode()
    write_bytes_durably(partial / "meta.json", meta_bytes)
    algorithm = storage.PREFERRED
    records = {**records, "meta.json": FileRecord(len(meta_bytes), hash_bytes(meta_bytes, algorithm), 0, algorithm)}
    manifest = build_manifest(step, world, records, meta)
    mismatch = check_sizes(partial, manifest)
    if mismatch:
        raise PartitaError(f"checkpoint {partial} does not match what was written ({mismatch[0]}); not committed")
    write_bytes_durably(partial / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())
    aside = None
    if final.exists():  # a checkpoint of the same step from an earlier run: replaced by this verified one
        aside = final.with_name(final.name + ".replaced")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
    os.replace(partial, final)
    fsync_dir(root)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    apply_keep_rule(root, keep)


def apply_keep_rule(root: str | Path, keep: int) -> list[Path]:
    """Delete complete checkpoints older than the ``keep`` newest *verified* ones; returns what
    was deleted. Legacy ones older than those are deleted too; the newest verified one is
    never deleted (``keep`` <= 0 keeps everything); damaged, ``corrupt-*`` and partial
    directories are never counted and never touched."""
    if keep <= 0:
        return []
    found = scan_checkpoints(root)
    verified = [f for f in found if f.kind == "verified"]
    if len(verified) <= keep:
        return []
    oldest_kept = verified[-keep].step
    gone = []
    for f in found:
        if f.kind in ("verified", "legacy") and f.step < oldest_kept:
            shutil.rmtree(f.path, ignore_errors=True)
            gone.append(f.path)
    return gone


def _save_error(e: BaseException, partial: Path, root: Path, step: int) -> str:
    """The one line for a failed ``dcp.save``; a refused non-finite state also takes its
    own (empty or half-written) partial directory away again."""
    failures = e.failures.values() if isinstance(e, CheckpointException) else []
    bad = next((exc for exc, _ in failures if isinstance(exc, NonFiniteState)), None)
    if bad is None:
        return f"could not write checkpoint {partial} (earlier checkpoints are intact): {one_line(e)}"
    if dist.get_rank() == 0:
        shutil.rmtree(partial, ignore_errors=True)
    return (f"refusing to save checkpoint step {step}: {bad} is not finite (NaN or inf); "
            f"the checkpoints in {root} are unchanged")


def save_checkpoint(pm, root: str | Path, step: int, meta: dict, keep: int = 2,
                    report: Report | None = None, check_finite: bool = True) -> Path:
    """Collective: write ``root/step_<step>/`` atomically with a manifest of every file's size
    and hash (taken while writing), then keep the newest ``keep`` verified checkpoints. A
    state holding a NaN/inf is refused (each rank checks the tensors it writes, before
    writing), and a failed write (not writable, disk full) is one ``PartitaError`` naming
    the directory; in both cases the committed checkpoints are untouched. ``check_finite``
    False skips the finite check (one read of the state) for callers that guarantee it."""
    root = Path(root)
    final = root / f"step_{step:08d}"
    partial = root / f"step_{step:08d}.partial"
    rank, world = dist.get_rank(), dist.get_world_size()
    agree(lambda: _prepare(root, partial, report) if rank == 0 else None, f"could not create checkpoint {partial}")
    writer = ChecksummingWriter(partial, rank, check_finite=check_finite)
    try:
        dcp.save({**state_for_checkpoint(pm), **compression_tensors(pm)}, storage_writer=writer)  # + PowerSGD state
        error = None
    except (OSError, CheckpointException) as e:
        error = _save_error(e, partial, root, step)
    if os.environ.get("PARTITA_CRASH_IN_SAVE") == str(step):  # fault injection for tests
        os._exit(3)
    records: dict[str, FileRecord] = {}
    for per_rank_error, per_rank in gather((error, writer.records)):  # one gather: errors and records
        if per_rank_error:
            raise PartitaError(per_rank_error)
        records.update(per_rank)
    agree(lambda: _commit(root, partial, final, step, world, records, meta, keep) if rank == 0 else None,
          f"could not finish checkpoint {partial} (earlier checkpoints are intact)")
    return final


def load_checkpoint(pm, path: str | Path) -> dict:
    """Load a checkpoint written under any plan into ``pm``; returns its metadata."""
    path = Path(path)
    state = state_for_checkpoint(pm, init_optimizer=True)
    state.update(compression_targets(pm, path))  # this rank's PowerSGD state, when saved
    scalars = {k: v for k, v in state.items() if torch.is_tensor(v) and v.dim() == 0}
    dcp.load(state, checkpoint_id=str(path))
    restore_compression(pm, state)
    # 0-dim tensors (Adam's step) are loaded by replacement in the dict, copy them back
    params = _named_params(pm)
    by_name = {name: p for name, p in params.items()}
    for opt in _torch_optimizers(pm.optimizer):
        for p, st in opt.state.items():
            name = next((n for n, q in by_name.items() if q is p), None)
            for key in list(st):
                k = f"optim.{name}.{key}"
                if k in scalars and torch.is_tensor(st[key]) and st[key].dim() == 0:
                    st[key].copy_(state[k])
    return json.loads((path / "meta.json").read_text())
