"""Issue 36 items 3 and 5: LoRA with PEFT's own layers under Partita's parallelism, equal to
single-process PEFT on the same packed SFT rows (SGD, 3 steps); the adapters it saves load
with ``PeftModel.from_pretrained`` and give Partita's eval loss. One torchrun of 4 gloo
processes for every case (tests/lora_runtime_worker.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

WORKER = Path(__file__).parent / "lora_runtime_worker.py"
CASES = ["dp=2,tp=2", "dp=2,tp=2,sp=false", "dp=4,zero=3", "dp=2,tp=2,zero=3"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("lora") / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
           f"--log-dir={out.parent / 'logs'}", str(WORKER), str(out), *CASES]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out.parent, json.loads(out.read_text())


@pytest.mark.parametrize("case", CASES)
def test_lora_matches_single_process_peft(results, case):
    r = results[1][case]
    assert max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"])) <= 1e-5, r
    assert r["adapter_max_diff"] <= 1e-6 and r["adapters_compared"] == 28, r
    assert r["adapter_moved"] > 1e-3  # the adapters did train
    assert r["base_changed"] == 0.0   # the base stayed frozen
    assert r["trainable"] == r["ref_trainable"]  # PEFT's own count of trainable parameters


@pytest.mark.parametrize("case", ["dp=2,tp=2", "dp=4,zero=3"])
def test_saved_adapter_loads_in_peft_with_partitas_eval_loss(results, case):
    import torch.nn.functional as F
    from peft import PeftModel

    sys.path.insert(0, str(WORKER.parent))
    import lora_runtime_worker as w
    from partita.models.hf import build_tiny_hf
    folder, r = results
    adapter = folder / w.case_dir(case)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(adapter))
    model = PeftModel.from_pretrained(build_tiny_hf(*w.LLAMA, seed=0), str(adapter)).eval()
    rows = w.sft_rows(w.STEPS * 4, 32, 256)
    with torch.no_grad():
        losses = [float(F.cross_entropy(model(input_ids=rows["inputs"][i:i + 1], position_ids=rows["positions"][i:i + 1],
                                              use_cache=False).logits.flatten(0, 1), rows["targets"][i].flatten()))
                  for i in range(w.STEPS * 4)]
    assert abs(sum(losses) / len(losses) - r[case]["eval_loss"]) <= 1e-5
