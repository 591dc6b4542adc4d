"""Shape-only shortcuts for normalisation kernels whose meta implementation is slow Python.

On the meta device, ``aten.native_group_norm_backward`` and
``aten.native_layer_norm_backward`` have no C++ meta kernel: torch runs their Python
decompositions (``torch/_decomp/decompositions.py``), dozens of reference ops each. On the
SD-XL UNet's 46 GroupNorms that was about a quarter of the traced backward's CPU time; the
GroupNorm forward (``aten.native_group_norm``, also a Python reference on meta) took another
~0.05 s of a 0.85 s trace.
Their results are new, unaliased gradient tensors whose shapes are the input's and the
affine parameters' (the ops' schemas in ``aten/src/ATen/native/native_functions.yaml``),
and backward saves nothing for later - so returning empty tensors of those shapes changes
no figure the trace records: FLOPs (``FlopCounterMode`` counts neither op; it runs outside
this mode and sees them first) nor saved bytes (``saved_tensors_hooks`` see only forward).
The forward shortcut returns new tensors of the reference's shapes and dtypes (the output
like the input, mean and rstd ``(N, group)``), so what autograd saves of them - the bytes the
trace counts - is unchanged (``tests/test_trace.py`` compares the whole spec to the byte).
Used only for meta tensors; any other device runs the real kernel.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_SHORTCUTS = (aten.native_group_norm_backward.default, aten.native_layer_norm_backward.default,
              aten.native_group_norm.default)


def _like(t: torch.Tensor | None, wanted: bool) -> torch.Tensor | None:
    return torch.empty_like(t, memory_format=torch.contiguous_format) if wanted and t is not None else None


class FastMetaBackward(TorchDispatchMode):
    """Empty gradients of the right shapes for normalisation backward ops on meta (``hits``
    counts the shortcuts taken)."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SHORTCUTS and args[0 if func is aten.native_group_norm.default else 1].device.type == "meta":
            self.hits += 1
        if func is aten.native_group_norm.default and args[0].device.type == "meta":
            # (input, weight, bias, N, C, HxW, group, eps) -> (out, mean, rstd): the reference's
            # (torch/_refs native_group_norm) out has the input's shape, mean and rstd (N, group),
            # all three in the input's dtype
            x, stats = args[0], torch.empty((args[3], args[6]), dtype=args[0].dtype, device=args[0].device)
            return torch.empty_like(x), stats, torch.empty_like(stats)
        if func is aten.native_group_norm_backward.default and args[1].device.type == "meta":
            # (grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask)
            x, weight, mask = args[1], args[4], args[9]
            gamma = weight if weight is not None else torch.empty(args[6], dtype=x.dtype, device=x.device)
            return _like(x, mask[0]), _like(gamma, mask[1]), _like(gamma, mask[2])
        if func is aten.native_layer_norm_backward.default and args[1].device.type == "meta":
            # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
            x, weight, bias, mask = args[1], args[5], args[6], args[7]
            return _like(x, mask[0]), _like(weight, mask[1]), _like(bias, mask[2])
        return func(*args, **kwargs)
