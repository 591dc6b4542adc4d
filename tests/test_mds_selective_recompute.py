"""Megatron-DeepSpeed's ``--recompute-granularity selective`` as the fork runs it (framework deepspeed).

The fork's model code (microsoft/Megatron-DeepSpeed@f4157bea69f3df8c6cb66f2ebcda66ba03d1288e
megatron/model/transformer.py l.624-629 and l.864-869) checkpoints the unfused ``CoreAttention`` as a
module (``_checkpointed_attention_forward``: ``tensor_parallel.checkpoint`` of the core attention) and
nothing else; with flash attention the attribute is never set. So the unfused script is priced as
Megatron-Core's ``core_attn`` module recompute, and the flash one as no recompute.

Oracles: the script (a real example trimmed, repo@commit in its header) and the paper's count of what the
core attention keeps - Korthikanti et al. 2022 (arXiv:2205.05198) sec. 4.1: the softmax output, ``2 a s^2 b``
bytes per layer in 16-bit (``a`` heads per tensor-parallel rank), is what selective recompute frees
(the dropout mask, ``a s^2 b``, is not kept at ``--attention-dropout 0``); ``partita estimate`` of the same
plan without recompute (a cross-command check). In-process CLI calls.
"""
from __future__ import annotations

import json
from pathlib import Path

from partita.cli import main

#: microsoft/Megatron-DeepSpeed@f4157be:examples_deepspeed/pretrain_llama2_distributed.sh, trimmed, with its
#: commented "--recompute-granularity selective" chosen; USE_FLASH_ATTN=true adds --use-flash-attn-v2
SCRIPT = Path(__file__).parent / "data" / "launch_configs" / "megatron_deepspeed" / "llama2_selective_recompute.sh"
HW = ["--hardware", "h100-sxm"]


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_unfused_selective_is_the_core_attention_module(capsys, tmp_path):
    est = _json(capsys, ["estimate", "--from-script", str(SCRIPT), *HW])
    plan = est["plan"]
    assert plan["framework"] == "deepspeed" and plan["attention"] == "unfused"
    assert plan["recompute"] == "selective" and plan["recompute_modules"] == "core_attn"
    assert est["time"]["recompute"] > 0
    # the same plan without recompute: the gap is the softmax output the checkpoint frees
    model = _json(capsys, ["import", str(SCRIPT)])["model"]
    (tmp_path / "model.json").write_text(json.dumps(model))
    none = {k: v for k, v in plan.items() if k != "recompute_modules"} | {"recompute": "none"}
    (tmp_path / "plan.json").write_text(json.dumps(none))
    plain = _json(capsys, ["estimate", "--plan", str(tmp_path / "plan.json"), "--model", str(tmp_path / "model.json"),
                           *HW, "--devices", "8"])
    heads, s, b = model["heads"] // plan["tp"], plan["seq_len"], plan["mbs"]
    layers_per_stage, in_flight = model["layers"] // plan["pp"], plan["pp"]  # 1F1B: stage 0 holds pp micro-batches
    softmax_gib = 2 * heads * s * s * b * layers_per_stage * in_flight / 2**30  # Korthikanti et al. sec. 4.1
    freed = plain["memory"]["activations"] - est["memory"]["activations"]
    assert abs(freed / softmax_gib - 1) < 0.02, (freed, softmax_gib)


def test_flash_attention_selective_recomputes_nothing(capsys):
    est = _json(capsys, ["estimate", "--from-script", str(SCRIPT), "--env", "USE_FLASH_ATTN=true", *HW])
    plan = est["plan"]
    assert plan["framework"] == "deepspeed" and plan.get("attention", "fused") == "fused"
    assert plan["recompute"] == "none" and not plan.get("recompute_modules")
    assert "recompute" not in est["time"]
    assert any(n.startswith("--recompute-granularity selective:") and "flash attention" in n
               for n in est["not_modelled"])
