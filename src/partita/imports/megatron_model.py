"""The model a Megatron-LM / MindSpeed-LLM command line defines, as a :class:`ModelSpec`
(issue 32 item 2): a launch script that says ``--num-layers 80 --hidden-size 8192`` is a 70B
model whatever ``--model`` says.

Each field is what the framework builds from the flag, with its defaults where the flag is
absent (NVIDIA/Megatron-LM@d98e8a6, megatron/training/arguments.py and
megatron/core/transformer/transformer_config.py; MindSpeed-LLM@c77308a):

- ``--ffn-hidden-size`` absent: ``4h``, or ``int(4h * 2/3 / 64) * 64`` with ``--swiglu``
  (arguments.py ``validate_args``); ``--kv-channels`` absent: ``h / heads``;
- query groups only with ``--group-query-attention`` (else every head has its own K/V);
- the vocabulary Megatron runs is ``--padded-vocab-size``, else ``--vocab-size`` padded up to a
  multiple of ``--make-vocab-size-divisible-by`` (128) x tp
  (megatron/core/tokenizers/utils/build_tokenizer.py ``vocab_size_with_padding``); a tokenizer
  whose size only the tokenizer files know is named in the refusal;
- defaults: LayerNorm, learned absolute positions, GeLU, tied embeddings, biases on every linear
  layer (``add_bias_linear``; ``--disable-bias-linear`` removes them), top-2 routing, expert FFN =
  ``--ffn-hidden-size``; MLA's kv rank 512 (the MLA config's default; arguments.py says 32 only
  where the MLA config is not built), qk head 128, rope head 64, v head 128;
- shared experts: Megatron builds one MLP of ``--moe-shared-expert-intermediate-size``;
  MindSpeed-LLM's ``--n-shared-experts N`` sets that size to N x the expert FFN
  (mindspeed_llm/features_manager/moe/shared_expert.py);
- ``--moe-layer-freq``: an integer N (one MoE layer every N) or Megatron's pattern list
  (``"([0]*3+[1]*58)"``, 1 = MoE), read here without ``eval`` (:func:`moe_pattern`);
- ``--noop-layers`` (MindSpeed): identity layers, not part of the model.
"""
from __future__ import annotations

import argparse
import ast
import math
from dataclasses import dataclass
from typing import Any

from ..errors import PartitaError
from ..spec.model import ModelSpec

#: Tokenizers whose vocabulary Megatron knows without files (gpt2-vocab.json: 50257 tokens).
KNOWN_TOKENIZERS = {"GPT2BPETokenizer": 50257}
#: Spellings of the MLA flags: Megatron-LM / MindSpeed-LLM first, then other forks'.
_MLA_ALIASES = {"--qk-rope-head-dim": "--qk-pos-emb-head-dim", "--qk-nope-head-dim": "--qk-head-dim"}


def model_parser() -> argparse.ArgumentParser:
    """The model flags of a Megatron command line (everything else is left to the layout reader)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
                 "--kv-channels", "--vocab-size", "--padded-vocab-size", "--seq-length", "--max-position-embeddings",
                 "--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size",
                 "--n-shared-experts", "--first-k-dense-replace", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
                 "--qk-pos-emb-head-dim", "--v-head-dim", "--tensor-model-parallel-size", "--moe-intermediate-size",
                 "--multiple-of"):
        p.add_argument(flag, type=int)
    p.add_argument("--hidden-dim-multiplier", type=float)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    for flag in ("--group-query-attention", "--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights",
                 "--add-qkv-bias", "--disable-bias-linear", "--qk-layernorm", "--multi-latent-attention",
                 "--multi-head-latent-attention", "--use-rotary-position-embeddings", "--shared-expert-gate",
                 "--geglu", "--gelu-tanh", "--is-hybrid-model"):
        p.add_argument(flag, action="store_true")
    for flag in ("--normalization", "--position-embedding-type", "--moe-layer-freq", "--tokenizer-type",
                 "--tokenizer-name-or-path", "--tokenizer-model", "--noop-layers", "--merge-file",
                 "--patch-tokenizer-type", "--load", "--hybrid-override-pattern"):
        p.add_argument(flag, nargs="?")  # a path from an unset positional ($2) leaves the flag bare
    return p


def _eval_list(node: ast.AST) -> list[int]:
    """A Megatron MoE pattern: list literals of 0/1, ``+`` and ``* n`` (nothing else evaluated)."""
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and e.value in (0, 1) for e in node.elts):
        return [e.value for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _eval_list(node.left) + _eval_list(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant) \
            and isinstance(node.right.value, int) and 0 <= node.right.value <= 100_000:
        return _eval_list(node.left) * node.right.value
    raise ValueError("not a list of 0/1")


def moe_pattern(text: str, layers: int) -> tuple[int, int]:
    """(first dense layers, MoE layer frequency) of ``--moe-layer-freq``: an integer, or a pattern
    list that is some dense layers then one MoE layer every ``freq`` (others are not expressible)."""
    text = text.strip().strip("\"'")
    if text.lstrip("-").isdigit():  # MindSpeed-LLM's -1: every layer (its test is ``i % freq == 0``)
        return 0, max(1, int(text))
    try:
        pattern = _eval_list(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        raise PartitaError(f"--moe-layer-freq {text!r} is neither a whole number nor a list of 0/1 "
                           "(Megatron's pattern, e.g. ([0]*3+[1]*58))") from None
    if len(pattern) != layers:
        raise PartitaError(f"--moe-layer-freq has {len(pattern)} entries, --num-layers is {layers}")
    first = next((i for i, x in enumerate(pattern) if x), layers)
    moe = [i - first for i, x in enumerate(pattern) if x]
    freq = moe[1] - moe[0] if len(moe) > 1 else 1
    if any(x != (i >= first and (i - first) % freq == 0) for i, x in enumerate(pattern)):
        raise PartitaError(f"--moe-layer-freq {text}: Partita models MoE layers as leading dense layers then one "
                           "MoE layer every N; this pattern is not of that form")
    return first, freq


def _vocab(ns: argparse.Namespace, tp: int) -> int | None:
    """The (padded) vocabulary Megatron runs, or None where only the tokenizer files know it."""
    if ns.padded_vocab_size:
        return ns.padded_vocab_size
    # a BPE merge file without a tokenizer type: pretrain_gpt.py's default GPT2BPETokenizer
    # (its ``args_defaults``, Megatron-LM 2021, e.g. @c1e0689^)
    kind = ns.tokenizer_type or ("GPT2BPETokenizer" if ns.merge_file else "")
    size = ns.vocab_size or KNOWN_TOKENIZERS.get(kind)
    if not size:
        return None
    multiple = max(1, ns.make_vocab_size_divisible_by) * tp
    return int(math.ceil(size / multiple) * multiple)


def unresolved_vocab(argv: list[str]) -> str:
    """The words naming what the script's vocabulary depends on, for a refusal."""
    ns, _ = model_parser().parse_known_args(argv)
    # Pai-Megatron-Patch: --patch-tokenizer-type, its HF tokenizer read from --load, plus --extra-vocab-size
    # (alibaba/Pai-Megatron-Patch@a098ca5 megatron_patch/tokenizer/__init__.py: padded = vocab + extra)
    source = ns.tokenizer_name_or_path or ns.tokenizer_model or (ns.load if ns.patch_tokenizer_type else None)
    what = f"tokenizer {ns.tokenizer_type or ns.patch_tokenizer_type or 'of the script'}" + \
        (f" at {source}" if source else "")
    return (f"the vocabulary size is in the {what}, not on the command line: pass --model (a preset or the "
            "config.json, whose vocab is used) or add --padded-vocab-size / --vocab-size to the script")


@dataclass(frozen=True)
class ScriptModel:
    """What the command line says about the model: the spec (None when the script does not
    define one) and, when it defines all but the vocabulary, why that is missing."""

    spec: ModelSpec | None
    missing_vocab: str = ""


def _moe(ns: argparse.Namespace, ffn: int, layers: int) -> dict[str, Any] | None:
    """The MoE fields (module docstring: shared experts as one MLP, the layer pattern), or None."""
    if not ns.num_experts:
        return None
    # MindSpeed-LLM's deprecated --moe-intermediate-size sets moe_ffn_hidden_size (Ascend/MindSpeed-LLM@c77308a
    # mindspeed_llm/features_manager/arguments/deprecated_args.py: ``args.moe_ffn_hidden_size = ...``)
    expert_ffn = ns.moe_ffn_hidden_size or ns.moe_intermediate_size or ffn
    shared = ns.moe_shared_expert_intermediate_size or (ns.n_shared_experts or 0) * expert_ffn
    first, freq = moe_pattern(ns.moe_layer_freq, layers) if ns.moe_layer_freq else (0, 1)
    return {"num_experts": ns.num_experts, "top_k": ns.moe_router_topk or 2, "expert_ffn_hidden": expert_ffn,
            "shared_experts": 1 if shared else 0, "shared_ffn_hidden": shared,
            "first_dense_layers": max(0, ns.first_k_dense_replace) if ns.first_k_dense_replace is not None else first,
            "layer_freq": freq, "shared_expert_gate": ns.shared_expert_gate}


def _mla(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The MLA widths at Megatron's MLA defaults where absent (module docstring), or None."""
    if not (ns.multi_latent_attention or ns.multi_head_latent_attention):
        return None
    return {"q_lora_rank": ns.q_lora_rank or 0, "kv_lora_rank": ns.kv_lora_rank or 512,
            "qk_rope_head_dim": ns.qk_pos_emb_head_dim or 64, "qk_nope_head_dim": ns.qk_head_dim or 128,
            "v_head_dim": ns.v_head_dim or 128}


def _position(ns: argparse.Namespace) -> str:
    """Partita's position kind: MindSpeed's --use-rotary-position-embeddings is rope; Megatron's
    default is learned absolute positions."""
    kind = ns.position_embedding_type or ("rope" if ns.use_rotary_position_embeddings else "learned_absolute")
    # only learned positions carry weights (a table); every rotary variant (rope, mrope, yarn, a
    # fork's own such as MindSpeed-LLM's "deepseek4") and none cost the same as rope here
    return {"learned_absolute": "learned", "alibi": "alibi"}.get(kind, "rope")


def _default_ffn(ns: argparse.Namespace, h: int) -> int:
    """Megatron's FFN width where ``--ffn-hidden-size`` is absent: ``4h``; with ``--swiglu``
    ``int(4h * 2/3 / 64) * 64``, or, with FlagScale's ``--multiple-of M`` (and ``--hidden-dim-multiplier``),
    LLaMA's ``int(4h * 2/3)`` (times the multiplier) rounded up to a multiple of M
    (FlagOpen/FlagScale@da4935e flagscale/backends/Megatron-LM/megatron/training/arguments.py.patch)."""
    if not ns.swiglu:
        return 4 * h
    if ns.multiple_of:
        dim = int(4 * h * 2 / 3)
        if ns.hidden_dim_multiplier:
            dim = int(dim * ns.hidden_dim_multiplier)
        return ns.multiple_of * ((dim + ns.multiple_of - 1) // ns.multiple_of)
    return int((4 * h * 2 / 3) / 64) * 64


def model_from_megatron(argv: list[str], name: str = "script") -> ScriptModel:
    """The model of a Megatron / MindSpeed-LLM command line; ``spec`` None when the script does
    not give ``--num-layers``, ``--hidden-size`` and ``--num-attention-heads``."""
    argv = [_MLA_ALIASES.get(a.split("=")[0], a.split("=")[0]) + a[len(a.split("=")[0]):] for a in argv]
    ns, _ = model_parser().parse_known_args(argv)
    if not (ns.num_layers and ns.hidden_size and ns.num_attention_heads):
        return ScriptModel(None)
    if ns.is_hybrid_model or ns.hybrid_override_pattern:
        # Megatron's hybrid stack (megatron/core/models/mamba): --num-layers counts Mamba, attention and MLP
        # layers of the pattern separately; Partita's model is a transformer's (attention + MLP per layer)
        return ScriptModel(None, "a hybrid Mamba/attention model (--is-hybrid-model / --hybrid-override-pattern "
                           f"{(ns.hybrid_override_pattern or '')[:24]}...): Partita models transformer layers only, "
                           "and --num-layers counts each Mamba, attention and MLP layer; pass --model for an "
                           "estimate of a transformer of that size")
    vocab = _vocab(ns, ns.tensor_model_parallel_size or 1)
    if vocab is None:
        return ScriptModel(None, unresolved_vocab(argv))
    h, heads = ns.hidden_size, ns.num_attention_heads
    ffn = ns.ffn_hidden_size or _default_ffn(ns, h)
    noop = len({x for x in (ns.noop_layers or "").split(",") if x.strip().isdigit()})
    layers = ns.num_layers - noop
    position = _position(ns)
    data: dict[str, Any] = {
        "name": name, "hidden": h, "layers": layers, "heads": heads,
        "kv_heads": ns.num_query_groups if ns.group_query_attention and ns.num_query_groups else heads,
        "ffn_hidden": ffn, "vocab": vocab, "head_dim": ns.kv_channels if ns.kv_channels else 0,
        "activation": "swiglu" if ns.swiglu else "geglu" if ns.geglu or ns.gelu_tanh  # MindSpeed-LLM: gated
        else "relu2" if ns.squared_relu else "gelu",
        "norm": "rmsnorm" if (ns.normalization or "").lower() == "rmsnorm" else "layernorm",
        "qkv_bias": ns.add_qkv_bias or not ns.disable_bias_linear,
        "out_bias": not ns.disable_bias_linear, "mlp_bias": not ns.disable_bias_linear,
        "tied_embeddings": not ns.untie_embeddings_and_output_weights, "position": position,
        "max_positions": (ns.max_position_embeddings or ns.seq_length or 0) if position == "learned" else 0,
        "qk_norm": ns.qk_layernorm, "source": "launch script",
    }
    moe, mla = _moe(ns, ffn, layers), _mla(ns)
    if moe:
        data["moe"] = moe
    if mla:
        data["mla"] = mla
        data["head_dim"] = 0
        data["qk_norm"] = False  # MLA's --qk-layernorm is its latent norms, counted by MLASpec
    return ScriptModel(ModelSpec.from_dict(data, f"the model of {name}"))


#: ModelSpec fields whose disagreement between ``--model`` and the script is a contradiction.
COMPARED = ("layers", "hidden", "heads", "kv_heads")


def contradiction(given: ModelSpec, script: ModelSpec, path: str) -> str | None:
    """One line naming each structural field where ``--model`` and the script differ."""
    diffs = [f"{field} {getattr(given, field)} (--model {given.name}) vs {getattr(script, field)} (the script)"
             for field in COMPARED if getattr(given, field) != getattr(script, field)]
    if not diffs:
        return None
    return f"{path}: --model contradicts the script's model: " + ", ".join(diffs) + \
        "; drop --model to use the script's, or fix one of them"
