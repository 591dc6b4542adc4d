"""The torchtitan export's warning for a ``recompute=selective`` plan says what the estimate priced.

torchtitan 0.3.0's ``activation_checkpoint:selective`` is op-level SAC (pytorch/torchtitan
torchtitan/distributed/activation_checkpoint.py: its save list keeps the attention kernel's output
and every other matmul). Partita prices that for ``--framework torchtitan``; under ``--framework
megatron`` (the default) it prices Megatron-Core's module recompute with its default module list,
``["core_attn"]`` (NVIDIA/Megatron-LM d98e8a64dd megatron/core/transformer/transformer_config.py
``__post_init__``). Before, the export said torchtitan's SelectiveAC was "close to partita's
selective estimate" for both: for llama3-8b tp4 sp seq 8192 the two keep 124 and 272 MiB a layer.
"""
from __future__ import annotations

import re

from partita.cost.activations import activation_bytes_per_layer
from partita.export import export
from partita.export.torchtitan import torchtitan_settings
from partita.plan import Plan
from partita.spec.load import load_model

PLAN = Plan(dp=2, tp=4, sp=True, zero=3, gbs=16, seq_len=8192, recompute="selective")


def _selective(warnings: list[str]) -> list[str]:
    return [w for w in warnings if w.startswith("recompute=selective")]


def test_megatron_priced_plan_warns_of_module_recompute_with_both_figures():
    model = load_model("llama3-8b")
    (w,) = _selective(export("torchtitan", PLAN, model).warnings)
    assert "close to partita's selective estimate" not in w
    assert "module recompute (core_attn" in w and "--framework torchtitan" in w
    m = re.search(r"torchtitan keeps ([\d,]+\.\d) MiB .* estimate priced ([\d,]+\.\d) MiB", w)
    assert m, w
    titan, priced = (float(g.replace(",", "")) for g in m.groups())
    moe = bool(model.moe)
    assert titan == round(activation_bytes_per_layer(model, PLAN.with_(framework="torchtitan"), moe) / 2**20, 1)
    assert priced == round(activation_bytes_per_layer(model, PLAN, moe) / 2**20, 1)
    assert titan < priced  # core_attn keeps the QKV/MLP activations op-level SAC recomputes
    # without a model the warning still names the modules and the way out
    (w,) = _selective(torchtitan_settings(PLAN)[2])
    assert "core_attn" in w and "--framework torchtitan" in w


def test_op_level_plan_keeps_the_close_wording():
    for fw in ("torchtitan", "partita"):
        (w,) = _selective(export("torchtitan", PLAN.with_(framework=fw), load_model("llama3-8b")).warnings)
        assert "close to partita's selective estimate" in w and "core_attn" not in w
