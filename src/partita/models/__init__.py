"""Single-device reference models (no parallel code inside): LLaMA-style dense and MoE.

Parallelism is applied afterwards by :func:`partita.runtime.parallelize`.
"""
from .builder import build_named_model
from .llama import MODEL_PRESETS, Transformer, TransformerConfig, build_model

__all__ = ["Transformer", "TransformerConfig", "build_model", "build_named_model", "MODEL_PRESETS"]
