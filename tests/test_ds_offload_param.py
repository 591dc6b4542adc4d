"""DeepSpeed ``zero_optimization.offload_param`` below ZeRO-3, read as DeepSpeed runs it.

DeepSpeed does not refuse it: its config says the key is "Valid only with stage 3" but no validator checks it
(deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641 deepspeed/runtime/zero/config.py l.157-161,
l.382-393), and runtime/engine.py ``_configure_zero_optimizer`` hands ``offload_param_config`` only to the
stage-3 optimizers (l.2434-2555; the stage 1/2 branch, l.2382-2432, never reads it). So at ZeRO 1/2 the
parameters stay on the device: Partita prices them there and says the key is ignored, instead of naming
"parameters on the host" as a feature it does not model.

Fixture: DeepSpeed-Chat's reward-model script with ``--offload`` (dschat/utils/ds_utils.py writes
``offload_param`` beside ``offload_optimizer`` whatever the stage), its stage from ``$2``. Oracle for the
memory: LLaMA-2-7B's 6,738,415,616 parameters in bf16 on every rank (ZeRO 2 shards no weights).
"""
from __future__ import annotations

import json
from pathlib import Path

from partita.cli import main

#: deepspeedai/DeepSpeedExamples@45b4b71:applications/DeepSpeed-Chat/training/step2_reward_model_finetuning/
#: training_scripts/llama2/run_llama2_7b.sh
SCRIPT = Path(__file__).parent / "data" / "launch_configs" / "dschat" / "rm_llama2_7b_offload.sh"
ARGS = ["--model", "llama2-7b", "--hardware", "h100-sxm", "--devices", "8"]
LLAMA2_7B_PARAMS = 6_738_415_616  # meta-llama/Llama-2-7b-hf: the sum of its parameters' numel (transformers)


def _estimate(capsys, stage: int) -> dict:
    capsys.readouterr()
    assert main(["estimate", "--from-script", str(SCRIPT), "--args", f"out {stage}", *ARGS, "--json"]) == 0, \
        capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_offload_param_below_zero3_is_ignored_as_deepspeed_ignores_it(capsys):
    assert "--offload" in SCRIPT.read_text()
    est = _estimate(capsys, 2)
    assert est["plan"]["zero"] == 2 and est["plan"]["optimizer_offload"] == 1.0  # the optimizer offload stays
    assert abs(est["memory"]["weights"] * 2**30 / (2 * LLAMA2_7B_PARAMS) - 1) < 0.01  # every weight on the device
    notes = [n for n in est["not_modelled"] if n.startswith("zero_optimization.offload_param")]
    assert len(notes) == 1 and "stage 2" in notes[0] and "ignores" in notes[0], notes
    assert "ZeRO-Infinity" not in notes[0]


def test_offload_param_at_zero3_stays_named(capsys):
    est = _estimate(capsys, 3)
    assert est["plan"]["zero"] == 3
    notes = [n for n in est["not_modelled"] if n.startswith("zero_optimization.offload_param")]
    assert len(notes) == 1 and "parameters on the host" in notes[0], notes
