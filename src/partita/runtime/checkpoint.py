"""Distributed checkpoints that reshard across plans, written atomically.

State is saved with ``torch.distributed.checkpoint`` (DCP) in a *canonical* form that does
not depend on the plan: every model parameter and optimizer state tensor keyed by its
parameter name (``model.<fqn>``, ``optim.<fqn>.<state>``), as DTensors where the plan shards
them (tensor parallel, FSDP, and experts - wrapped as ``Shard(0)`` over the ep group) and
as plain tensors where it replicates them. DCP records each shard's global offsets, so a
checkpoint written under dp=2,tp=2 loads under pp=2,dp=2, dp=4 or one process.

A checkpoint directory is complete only once ``COMMITTED`` exists: files are written
into ``step_N.partial/``, rank 0 writes ``meta.json`` and the marker after every rank has
finished, then renames the directory to ``step_N/`` (an atomic rename). Anything else is
ignored on resume with a message naming it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

MARKER = "COMMITTED"
STEP_DIR = re.compile(r"^step_(\d+)$")


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


def save_checkpoint(pm, root: str | Path, step: int, meta: dict, keep: int = 2) -> Path:
    """Write ``root/step_<step>/`` atomically; keep the newest ``keep`` complete ones."""
    root = Path(root)
    final = root / f"step_{step:08d}"
    partial = root / f"step_{step:08d}.partial"
    rank = dist.get_rank()
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if partial.exists():
            shutil.rmtree(partial)
    dist.barrier()
    dcp.save(state_for_checkpoint(pm), checkpoint_id=str(partial))
    if os.environ.get("PARTITA_CRASH_IN_SAVE") == str(step):  # fault injection for tests
        os._exit(3)
    dist.barrier()
    if rank == 0:
        with open(partial / "meta.json", "w") as f:
            json.dump({**meta, "step": step}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        (partial / MARKER).write_text("ok\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        for old in complete_checkpoints(root)[:-keep] if keep > 0 else []:
            shutil.rmtree(old[1], ignore_errors=True)
    dist.barrier()
    return final


def complete_checkpoints(root: str | Path, report=None) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints under ``root``, oldest first; ``report`` is
    called with a message for every directory that looks like a checkpoint but is not one."""
    root = Path(root)
    found = []
    if not root.exists():
        return found
    for path in sorted(root.iterdir()):
        if not path.is_dir() or not path.name.startswith("step_"):
            continue
        m = STEP_DIR.match(path.name)
        why = None
        if m is None:
            why = "unfinished save (no atomic rename)"
        elif not (path / MARKER).exists():
            why = f"no {MARKER} marker"
        else:
            try:
                json.loads((path / "meta.json").read_text())
            except (OSError, ValueError):
                why = "unreadable meta.json"
        if why:
            if report:
                report(f"partita: skipping damaged or partial checkpoint {path}: {why}")
            continue
        found.append((int(m.group(1)), path))
    return sorted(found)


def load_checkpoint(pm, path: str | Path) -> dict:
    """Load a checkpoint written under any plan into ``pm``; returns its metadata."""
    path = Path(path)
    state = state_for_checkpoint(pm, init_optimizer=True)
    scalars = {k: v for k, v in state.items() if torch.is_tensor(v) and v.dim() == 0}
    dcp.load(state, checkpoint_id=str(path))
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
