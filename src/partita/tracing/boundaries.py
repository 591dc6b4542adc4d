"""Which tensors cross a block boundary: whether a pipeline may cut between any two blocks.

The traced pipeline (:mod:`partita.runtime.traced_pipeline`) cuts the model's own forward at
the call of a stage's first block: the stage before runs everything up to that call (its
blocks and whatever forward does after them - a norm, a projection, plain tensor code) and
sends the block's first input; the next stage runs the stem again (its inputs are the
batch), passes the earlier blocks through and takes the received tensor in place of that
input. That is exact only if nothing else computed before the cut is used after it: a
tensor made after the first block began (stem tensors are recomputed on every stage) and
used after a later block began - a long skip connection (U-ViT), a residual taken around a
block from outside it, a list of every block's output for the head - would be the
pass-through's garbage on the next stage.

:class:`BoundaryWatch` finds such tensors while the tracer's forward runs. Every storage an
op creates is labelled with the number of blocks entered so far (0: the stem and the model's
inputs); an op that reads a storage labelled ``1 <= L < entered`` reads across a boundary,
except a block reading its own first input (what the cut replaces by the received tensor) -
the caller reading that input again after the block (``x = block(x) + x``) is a crossing, as
the next stage's caller still holds the pass-through. A block's other tensor inputs must be
the stem's or the model's inputs. Views share their base's storage and label, and a view of an
unlabelled input stays unlabelled; in-place writes keep the label (a conservative miss: a stem
buffer updated in place between blocks is not seen). Parameters and buffers carry no label.
Replayed blocks (:mod:`.replay`) run no ops: their inputs are checked when they are entered,
which is where a skip connection enters a block.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils._python_dispatch import TorchDispatchMode


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.layout == torch.strided]


class BoundaryWatch(TorchDispatchMode):
    """Labels storages by the blocks entered before they were made; records reads across blocks.

    The tracer calls :meth:`enter_block` from each block's forward pre-hook (after counting
    it) and reads :attr:`crossing` afterwards: ``None``, or one line naming the first block
    whose boundary a tensor crossed."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = 0
        self.labels: dict[int, int] = {}
        self.keep: list[torch.Tensor] = []  # strong references: a labelled storage's id is never reused
        self.crossing: str | None = None
        self.blocks: list[str] = []  # paths of the blocks entered, in order
        self.inputs: list[int | None] = []  # storage of the first input of each block running now

    def _check(self, tensors: list[torch.Tensor], where: str) -> None:
        if self.crossing is not None:
            return
        for t in tensors:
            key = _storage(t)
            label = self.labels.get(key, 0)
            if 1 <= label < self.entered and key not in self.inputs:
                self.crossing = (f"its forward reads, in {where} once block {self.blocks[-1]} has begun, a tensor "
                                 f"made by or fed to block {self.blocks[label - 1]} (a skip connection around a "
                                 "block: a pipeline cut between them would lose it)")
                return

    def enter_block(self, path: str, args: tuple, kwargs: dict) -> None:
        """Block ``path`` is entered: while it runs it may read its first tensor input (the
        cut replaces it); its other tensor inputs must be the stem's or the model's."""
        self.entered += 1
        self.blocks.append(path)
        inputs = _tensors((args, kwargs))
        self.inputs.append(_storage(inputs[0]) if inputs else None)
        self._check(inputs[1:], f"the inputs of block {path}")

    def leave_block(self) -> None:
        self.inputs.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        self._check(inputs, f"{func.__name__}")
        out = func(*args, **kwargs)
        read = {_storage(t) for t in inputs}
        for t in _tensors(out):
            key = _storage(t)
            if key not in read and key not in self.labels:  # a new storage, not a view or in-place result
                self.labels[key] = self.entered
                self.keep.append(t)
        return out
