"""Read a Hugging Face ``config.json`` into a :class:`ModelSpec` without importing transformers.

Field names follow the transformers configuration classes of each ``model_type``.
A file may also be a Partita model JSON (our own field names; no ``model_type``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ..errors import PartitaError
from .model import MLASpec, MoESpec, ModelSpec


class _Fields:
    """Typed access to config fields with one-line errors naming the field."""

    def __init__(self, cfg: dict, where: str):
        self.cfg, self.where = cfg, where

    def int(self, *names: str, default: Any = ...) -> int:
        for name in names:
            if name in self.cfg and self.cfg[name] is not None:
                value = self.cfg[name]
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise PartitaError(f"{self.where}: field {name!r} must be a positive integer, got {value!r}")
                return value
        if default is ...:
            raise PartitaError(f"{self.where}: missing field {names[0]!r}")
        return default

    def text(self, name: str, default: str) -> str:
        value = self.get(name, default)
        if not isinstance(value, str):
            raise PartitaError(f"{self.where}: field {name!r} must be a string, got {value!r}")
        return value

    def get(self, name: str, default: Any = None) -> Any:
        value = self.cfg.get(name)
        return default if value is None else value


def _activation(name: Any, gated: bool) -> str:
    name = str(name or "").lower()
    if gated:
        return "swiglu" if name in ("silu", "swish", "") else "geglu"
    if name in ("relu2", "squared_relu"):
        return "relu2"
    return "relu" if name == "relu" else "gelu"


def _llama_like(c: _Fields, name: str, **extra: Any) -> ModelSpec:
    heads = c.int("num_attention_heads")
    values: dict[str, Any] = dict(
        name=name, hidden=c.int("hidden_size"), layers=c.int("num_hidden_layers"), heads=heads,
        kv_heads=c.int("num_key_value_heads", default=heads), ffn_hidden=c.int("intermediate_size"),
        vocab=c.int("vocab_size"), head_dim=c.int("head_dim", default=0),
        activation=_activation(c.text("hidden_act", "silu"), True),
        qkv_bias=bool(c.get("attention_bias", False)), mlp_bias=bool(c.get("mlp_bias", False)),
        tied_embeddings=bool(c.get("tie_word_embeddings", False)), source=c.where)
    values.update(extra)  # a family's fixed settings (qwen2: qkv_bias) win over the generic reads (issue 15)
    return ModelSpec(**values)


def _mixtral(c: _Fields, name: str) -> ModelSpec:
    moe = MoESpec(num_experts=c.int("num_local_experts"), top_k=c.int("num_experts_per_tok"),
                  expert_ffn_hidden=c.int("intermediate_size"))
    return _llama_like(c, name, moe=moe)


def _qwen_moe(c: _Fields, name: str, qwen3: bool) -> ModelSpec:
    step = c.int("decoder_sparse_step", default=1)
    mlp_only = c.get("mlp_only_layers", []) or []
    if mlp_only:
        raise PartitaError(f"{c.where}: mlp_only_layers is not supported yet (use an empty list)")
    shared = c.get("shared_expert_intermediate_size", 0) or 0
    moe = MoESpec(num_experts=c.int("num_experts"), top_k=c.int("num_experts_per_tok"),
                  expert_ffn_hidden=c.int("moe_intermediate_size"),
                  shared_experts=1 if shared else 0, shared_ffn_hidden=shared,
                  layer_freq=step, shared_expert_gate=bool(shared))
    extra: dict[str, Any] = {"moe": moe}
    if qwen3:
        extra["qk_norm"] = True
    else:
        extra["qkv_bias"] = True
    spec = _llama_like(c, name, **extra)
    return spec


def _deepseek_v3(c: _Fields, name: str) -> ModelSpec:
    moe = MoESpec(num_experts=c.int("n_routed_experts"), top_k=c.int("num_experts_per_tok"),
                  expert_ffn_hidden=c.int("moe_intermediate_size"),
                  shared_experts=c.int("n_shared_experts", default=0),
                  shared_ffn_hidden=c.int("moe_intermediate_size"),
                  first_dense_layers=c.get("first_k_dense_replace", 0), layer_freq=c.int("moe_layer_freq", default=1))
    q_lora = c.get("q_lora_rank") or 0
    mla = MLASpec(q_lora_rank=q_lora, kv_lora_rank=c.int("kv_lora_rank"), qk_rope_head_dim=c.int("qk_rope_head_dim"),
                  qk_nope_head_dim=c.int("qk_nope_head_dim"), v_head_dim=c.int("v_head_dim"))
    heads = c.int("num_attention_heads")
    return ModelSpec(name=name, hidden=c.int("hidden_size"), layers=c.int("num_hidden_layers"), heads=heads,
                     kv_heads=heads, ffn_hidden=c.int("intermediate_size"), vocab=c.int("vocab_size"),
                     tied_embeddings=bool(c.get("tie_word_embeddings", False)), moe=moe, mla=mla, source=c.where)


def _gpt2(c: _Fields, name: str) -> ModelSpec:
    h = c.int("n_embd", "hidden_size")
    return ModelSpec(name=name, hidden=h, layers=c.int("n_layer", "num_hidden_layers"),
                     heads=c.int("n_head", "num_attention_heads"), kv_heads=c.int("n_head", "num_attention_heads"),
                     ffn_hidden=c.int("n_inner", default=4 * h), vocab=c.int("vocab_size"),
                     activation=_activation(c.text("activation_function", "gelu_new"), False), norm="layernorm",
                     qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=bool(c.get("tie_word_embeddings", True)),
                     position="learned", max_positions=c.int("n_positions", "max_position_embeddings"),
                     dropout=True, source=c.where)


def _gpt_neox(c: _Fields, name: str) -> ModelSpec:
    heads = c.int("num_attention_heads")
    return ModelSpec(name=name, hidden=c.int("hidden_size"), layers=c.int("num_hidden_layers"), heads=heads,
                     kv_heads=heads, ffn_hidden=c.int("intermediate_size"), vocab=c.int("vocab_size"),
                     activation=_activation(c.text("hidden_act", "gelu"), False), norm="layernorm",
                     qkv_bias=bool(c.get("attention_bias", True)), out_bias=bool(c.get("attention_bias", True)),
                     mlp_bias=True, tied_embeddings=bool(c.get("tie_word_embeddings", False)), source=c.where)


def _bloom(c: _Fields, name: str) -> ModelSpec:
    h = c.int("hidden_size", "n_embed")
    heads = c.int("n_head", "num_attention_heads")
    return ModelSpec(name=name, hidden=h, layers=c.int("n_layer", "num_hidden_layers"), heads=heads, kv_heads=heads,
                     ffn_hidden=4 * h, vocab=c.int("vocab_size"), activation="gelu", norm="layernorm",
                     qkv_bias=True, out_bias=True, mlp_bias=True, tied_embeddings=True, position="alibi",
                     embedding_norm=True, source=c.where)


PARSERS: dict[str, Callable[[_Fields, str], ModelSpec]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": lambda c, n: _llama_like(c, n, qkv_bias=True),
    "qwen3": lambda c, n: _llama_like(c, n, qk_norm=True),
    "mixtral": _mixtral,
    "qwen2_moe": lambda c, n: _qwen_moe(c, n, qwen3=False),
    "qwen3_moe": lambda c, n: _qwen_moe(c, n, qwen3=True),
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
}


def parse_hf_config(cfg: dict, where: str = "config.json", name: str | None = None) -> ModelSpec:
    """Turn a parsed HF config dict into a ModelSpec (raises PartitaError naming the bad field)."""
    model_type = cfg.get("model_type")
    if model_type is None:
        raise PartitaError(f"{where}: missing field 'model_type' (supported: {', '.join(sorted(PARSERS))})")
    parser = PARSERS.get(model_type)
    if parser is None:
        raise PartitaError(f"{where}: model_type {model_type!r} is not supported (supported: {', '.join(sorted(PARSERS))})")
    spec = parser(_Fields(cfg, where), name or cfg.get("_name_or_path") or model_type)
    return spec.validated(where)


def load_json_model(path: Path) -> ModelSpec:
    """Load an HF config.json, or a Partita model JSON (no ``model_type`` key)."""
    from ..inputs import read_json
    cfg = read_json(path, "model")  # one-line errors for directory/non-UTF-8/non-JSON/deep/NaN files
    if not isinstance(cfg, dict):
        raise PartitaError(f"{path}: must hold a JSON object")
    name = path.parent.name if path.name == "config.json" else path.stem
    if "model_type" in cfg:
        return parse_hf_config(cfg, str(path), name)
    return ModelSpec.from_dict({"name": name, **cfg}, str(path))
