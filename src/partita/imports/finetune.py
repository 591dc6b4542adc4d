"""LoRA target modules as the fine-tuning frameworks name them, read into the plan's
``lora_targets`` (issue 36 item 4): ``attention`` (q, k, v, o), ``qkv`` (q, k, v exactly: NeMo's
``linear_qkv`` alone), ``mlp`` (gate, up, down) or ``all-linear`` (both).

The names are each framework's own module names:

- Hugging Face / PEFT (LLaMA-Factory ``lora_target``, ms-swift ``--target_modules``): Llama-style
  ``q_proj k_proj v_proj o_proj`` / ``gate_proj up_proj down_proj``, fused ``qkv_proj`` /
  ``gate_up_proj``, GLM/Falcon ``query_key_value dense dense_h_to_4h dense_4h_to_h``, GPT-2 ``c_attn
  c_proj c_fc``, Mixtral experts ``w1 w2 w3``; ``all`` (LLaMA-Factory: every linear but the output
  layer, ``find_all_linear_modules``) and ``all-linear`` (PEFT / ms-swift: the same) are both groups.
- Megatron-Core (MindSpeed-LLM ``--lora-target-modules``, Megatron-SWIFT): ``linear_qkv linear_proj``
  (``linear_q linear_kv`` with MLA-style split projections) / ``linear_fc1 linear_fc2``.

A list that covers only part of a group (``q_proj,v_proj``: PEFT's default for Llama) is read as the
whole group - the nearest the plan can say - and named in a note, never dropped.
"""
from __future__ import annotations

from ..errors import PartitaError

#: group -> the alternative complete sets of module names of that group (any one covers it).
_COMPLETE: dict[str, tuple[frozenset[str], ...]] = {
    "attention": (frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), frozenset({"qkv_proj", "o_proj"}),
                  frozenset({"query_key_value", "dense"}), frozenset({"c_attn", "c_proj"}),
                  frozenset({"linear_qkv", "linear_proj"}), frozenset({"linear_q", "linear_kv", "linear_proj"}),
                  # MLA / DeepSeek-V4 projections (MindSpeed-LLM@c77308a examples/mcore/deepseek4_flash)
                  frozenset({"linear_q_up_proj", "linear_kv_up_proj", "linear_proj"}),
                  frozenset({"linear_q", "linear_kv", "linear_q_up_proj", "linear_o_down_proj", "linear_o_up_proj"})),
    "mlp": (frozenset({"gate_proj", "up_proj", "down_proj"}), frozenset({"gate_up_proj", "down_proj"}),
            frozenset({"dense_h_to_4h", "dense_4h_to_h"}), frozenset({"c_fc"}), frozenset({"w1", "w2", "w3"}),
            frozenset({"fc1", "fc2"}), frozenset({"linear_fc1", "linear_fc2"})),
}
#: every module name of each group (a name in no group is refused in one line).
_NAMES = {group: frozenset().union(*sets) for group, sets in _COMPLETE.items()}
_NAMES["attention"] |= {"linear_q_proj", "linear_q_down_proj", "linear_kv_down_proj"}  # MLA's other projections
#: complete sets of the q/k/v projections alone (plan ``qkv``: NeMo 1.x's default ``attention_qkv``).
_QKV = (frozenset({"q_proj", "k_proj", "v_proj"}), frozenset({"qkv_proj"}), frozenset({"query_key_value"}),
        frozenset({"c_attn"}), frozenset({"linear_qkv"}), frozenset({"linear_q", "linear_kv"}))
#: names meaning every linear layer of the blocks.
ALL_LINEAR = frozenset({"all", "all-linear", "all_linear"})
#: the plan's value -> the module names each framework writes for it (exporters; Hugging Face / PEFT first).
HF_NAMES = {"attention": "q_proj,k_proj,v_proj,o_proj", "qkv": "q_proj,k_proj,v_proj", "mlp": "gate_proj,up_proj,down_proj",
            "all-linear": "all"}
MEGATRON_NAMES = {"attention": ("linear_qkv", "linear_proj"), "qkv": ("linear_qkv",), "mlp": ("linear_fc1", "linear_fc2"),
                  "all-linear": ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")}


def lora_targets(names: list[str] | tuple[str, ...], source: str) -> tuple[str, str]:
    """(the plan's ``lora_targets``, a note - "" when the names cover their groups exactly) of the
    module names a framework's LoRA setting lists (``source`` names the setting for the lines)."""
    words = {n.strip().strip("'\"[]") for name in names for n in name.replace(",", " ").split() if n.strip("'\"[] ")}
    if not words:
        raise PartitaError(f"{source} lists no module; give the linears that get an adapter (e.g. all)")
    if words & ALL_LINEAR:
        return "all-linear", ""
    unknown = sorted(w for w in words if not any(w in names for names in _NAMES.values()))
    if unknown:
        raise PartitaError(f"{source}: {', '.join(unknown)} is not a linear Partita knows (attention: q_proj ... "
                           f"o_proj, linear_qkv, linear_proj; MLP: gate_proj, up_proj, down_proj, linear_fc1, "
                           f"linear_fc2; or all)")
    if words in _QKV:  # the q/k/v projections exactly, the out projection not
        return "qkv", ""
    if any(words < s for s in _QKV):  # e.g. PEFT's common q_proj,v_proj: the nearest set is qkv
        return "qkv", (f"{source} {','.join(sorted(words))}: adapters on these linears only, estimated with "
                       f"adapters on q, k and v (lora_targets qkv)")
    groups = [g for g in _COMPLETE if words & _NAMES[g]]
    targets = "all-linear" if len(groups) == 2 else groups[0]
    partial = [g for g in groups if not any(s <= words for s in _COMPLETE[g])]
    note = "" if not partial else (f"{source} {','.join(sorted(words))}: adapters on these linears only, estimated "
                                   f"with adapters on every {' and '.join(partial)} linear (lora_targets {targets})")
    return targets, note


def mindspeed_finetune_flags(plan) -> tuple[list[tuple[str, ...]], list[str]]:
    """(MindSpeed-LLM's fine-tuning arguments for ``plan`` as ``(flag, *values)``, warnings): ``--finetune
    --stage sft --is-instruction-dataset`` for a fine-tune, plus ``--lora-r``, ``--lora-alpha`` and
    ``--lora-target-modules`` (Megatron-Core names) for LoRA (Ascend/MindSpeed-LLM@c77308a
    mindspeed_llm/features_manager/finetune/lora.py: ``--lora-alpha`` is an int; the script is
    ``posttrain_gpt.py``). Nothing for a pre-training plan. :func:`partita.imports.megatron` reads them back."""
    if plan.finetune == "none":
        return [], []
    flags: list[tuple[str, ...]] = [("--finetune",), ("--stage", "sft"), ("--is-instruction-dataset",)]
    warnings = []
    if plan.finetune == "lora":
        alpha = round(plan.lora_alpha)
        if alpha != plan.lora_alpha:
            warnings.append(f"lora_alpha {plan.lora_alpha}: MindSpeed-LLM's --lora-alpha is an integer; written {alpha}")
        flags += [("--lora-r", str(plan.lora_rank)), ("--lora-alpha", str(alpha)),
                  ("--lora-target-modules", *MEGATRON_NAMES[plan.lora_targets])]
        if plan.lora_dropout:  # no such argument at c77308a (mindspeed_llm/features_manager/finetune/lora.py)
            warnings.append(f"lora_dropout {plan.lora_dropout:g}: MindSpeed-LLM's LoRA has no dropout argument; "
                            "not written (the run keeps no dropout copies: it needs less memory than estimated)")
    return flags, warnings
