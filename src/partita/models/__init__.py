"""Single-device reference models (no parallel code inside): LLaMA-style dense and MoE, and
the registry that turns a model name into a model (:mod:`.registry`).

Parallelism is applied afterwards by :func:`partita.runtime.parallelize`. The names below
are loaded on first use, so that ``partita.models.registry`` can be imported (by the
launcher, before it knows torch is installed) without loading torch.
"""
from __future__ import annotations

import importlib

_LAZY = {"Transformer": ".llama", "TransformerConfig": ".llama", "build_model": ".llama", "MODEL_PRESETS": ".llama",
         "build_named_model": ".registry", "resolve_model": ".registry", "family_of": ".registry"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name], __name__), name)
