"""Find a model's repeated blocks: the units FSDP wraps, checkpointing recomputes and
pipeline stages cut along.

Two modules are *structurally identical* when they have the same class and the same
parameter names and shapes (:func:`signature`). The repeated block sequence is the
longest run of structurally identical children of one container (``nn.ModuleList``,
``nn.Sequential``, ``nn.ModuleDict``) - a transformer's layers, a DiT's transformer
blocks (torchtitan and transformers wrap exactly these with FSDP and activation
checkpointing). The *units* are every instance of that run's class in the model, not
nested in another unit: a diffusion UNet repeats its transformer blocks in several
lists (one per resolution, of different widths), and all of them are wrapped alike.
Pipeline parallelism needs one sequence: it applies when the units are exactly the run.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def signature(module: nn.Module) -> tuple:
    """Class and parameter names/shapes: equal for structurally identical modules."""
    return (type(module).__qualname__,
            tuple((n, tuple(p.shape)) for n, p in module.named_parameters()))


@dataclass(frozen=True)
class BlockLayout:
    """The repeated blocks of a model (empty ``units``: none found)."""

    container: str  # path of the container holding the longest run
    run: tuple[str, ...]  # paths of the run's blocks, in container order
    units: tuple[str, ...]  # every instance of the run's class, not nested in another unit

    @property
    def pipeline(self) -> bool:
        """Whether pipeline stages can cut along the units: they are the one run."""
        return bool(self.run) and self.units == self.run

    def pipeline_problem(self) -> str:
        """Why the units are not one run, in words ("" when they are, or when there are none):
        a unit beside the run in its container with other parameter shapes (SD3's last joint
        block, which drops the context branch), or units in other containers (a UNet's
        transformer blocks, one list per resolution)."""
        if not self.run or self.pipeline:
            return ""
        beside = [u for u in self.units if u not in self.run and u.rpartition(".")[0] == self.container]
        if beside:
            return (f"{', '.join(beside[:3])} {'has' if len(beside) == 1 else 'have'} other parameter shapes than "
                    f"{self.run[0]}, so its {len(self.units)} blocks are not one run of identical blocks")
        containers = sorted({u.rpartition(".")[0] for u in self.units})
        return (f"its {len(self.units)} blocks lie in {len(containers)} containers ({', '.join(containers[:2])}"
                f"{', ...' if len(containers) > 2 else ''}), not one run in one container")


def _runs(container: nn.Module, prefix: str) -> list[tuple[str, ...]]:
    """Maximal runs (length >= 2) of structurally identical children of ``container``."""
    runs: list[tuple[str, ...]] = []
    current: list[str] = []
    last = None
    for name, child in container.named_children():
        sig = signature(child) if sum(1 for _ in child.parameters()) else None
        path = f"{prefix}{name}"
        if sig is not None and sig == last:
            current.append(path)
        else:
            if len(current) >= 2:
                runs.append(tuple(current))
            current = [path] if sig is not None else []
        last = sig
    if len(current) >= 2:
        runs.append(tuple(current))
    return runs


def find_blocks(model: nn.Module) -> BlockLayout:
    """The longest run of identical children of one container, and every unit of its class.

    Ties go to the run holding more parameters (a transformer's layers over its
    per-layer norms)."""
    best: tuple[int, int, str, tuple[str, ...]] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, _CONTAINERS):
            continue
        for run in _runs(module, f"{path}." if path else ""):
            params = sum(p.numel() for p in model.get_submodule(run[0]).parameters()) * len(run)
            key = (len(run), params, path, run)
            if best is None or key[:2] > best[:2]:
                best = key
    if best is None:
        return BlockLayout("", (), ())
    _, _, container, run = best
    cls = type(model.get_submodule(run[0]))
    units: list[str] = []
    for path, module in model.named_modules():
        if type(module) is cls and not any(path.startswith(u + ".") for u in units):
            units.append(path)
    return BlockLayout(container, run, tuple(units))
