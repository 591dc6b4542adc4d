"""Issue 36 items 3 and 5: LoRA with PEFT's own layers under Partita's parallelism (dp, ZeRO-3
/ FSDP2, tp, pp and interleaved pp, cp, ep), equal to single-process PEFT on the same data
(SGD, 3 steps; packed SFT rows, plain token rows under cp - on the reference tiny-llama and,
``hf:dp=2,cp=2``, on the HF Llama); the adapters it saves (under pp:
every stage's, gathered) load with ``PeftModel.from_pretrained`` and give Partita's eval
loss. The cases run in 4 gloo processes (tests/lora_runtime_worker.py), the session's shared
torchrun (tests/conftest.py)."""
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
CASES = ["dp=2,tp=2", "dp=2,tp=2,sp=false", "dp=4,zero=3", "dp=2,tp=2,zero=3", "dp=2,pp=2",
         "dp=2,pp=2,vpp=2,zero=3,schedule=interleaved-1f1b", "dp=2,cp=2", "hf:dp=2,cp=2", "dp=4,ep=2"]
#: adapter tensors (A and B) = 2 x targeted linears x layers: all-linear on the 2-layer HF
#: Llama (7 linears), its 4-layer copy and the reference tiny-llama (4 layers); attention
#: (4 linears) on the 2-layer Qwen2-MoE
ADAPTERS = {"dp=2,pp=2,vpp=2,zero=3,schedule=interleaved-1f1b": 2 * 7 * 4, "dp=2,cp=2": 2 * 7 * 4,
            "dp=4,ep=2": 2 * 4 * 2}


#: the cases run in the session's shared 4-process torchrun (tests/conftest.py ``equivalence``):
#: tests/lora_runtime_worker.py's ``run_case`` in the processes the equivalence cases started
EQUIVALENCE_CASES = [(4, 0, case, str(WORKER)) for case in CASES]


@pytest.fixture(scope="module")
def results(equivalence):
    return {case: equivalence["results"][(4, 0, case, str(WORKER))] for case in CASES}


@pytest.mark.parametrize("case", CASES)
def test_lora_matches_single_process_peft(results, case):
    r = results[case]
    assert max(abs(a - b) for a, b in zip(r["losses"], r["ref_losses"])) <= 1e-5, r
    assert r["adapter_max_diff"] <= 1e-6 and r["adapters_compared"] == ADAPTERS.get(case, 2 * 7 * 2), r
    assert r["adapter_keys_match"]  # the saved (under pp: gathered) adapters are exactly PEFT's tensors
    assert r["adapter_moved"] > 1e-3  # the adapters did train
    assert r["base_changed"] == 0.0   # the base stayed frozen
    assert r["trainable"] == r["ref_trainable"]  # PEFT's own count of trainable parameters


@pytest.mark.parametrize("case", ["dp=2,pp=2,vpp=2,zero=3,schedule=interleaved-1f1b"])
def test_merged_weights_under_pp_equal_peft_merge_and_unload(results, case):
    """--merge under pp: every stage's ``W + (alpha / r) B A`` gathered, equal to PEFT's own
    ``merge_and_unload`` of the single-process run (every weight of the model)."""
    r = results[case]
    assert r["merged_keys_match"] and r["merged_max_diff"] <= 1e-6, r


@pytest.mark.parametrize("case", ["dp=2,cp=2", "hf:dp=2,cp=2"])
def test_packed_rows_under_cp_refused_in_one_line(results, case):
    from partita.runtime.parallelize import PACKED_CP
    msg = results[case]["packed_cp_refusal"]
    assert msg == PACKED_CP and "\n" not in msg and "cp=1" in msg


def test_lora_on_moe_experts_refused_in_one_line():
    """PEFT's ``target_modules`` cannot reach fused routed experts (its own injection on the
    MoE model adapts no parameter under ``experts``), so the runtime refuses LoRA targets
    other than attention on MoE models, in one line, before anything is built."""
    from peft import get_peft_model, LoraConfig
    from partita.errors import PartitaError
    from partita.models.hf import build_tiny_hf
    from partita.models.registry import TINY_HF_MOE
    from partita.plan import Plan
    from partita.runtime.lora import MOE_TARGETS
    from partita.runtime.parallelize import runtime_check
    model = build_tiny_hf(*TINY_HF_MOE["hf-qwen2-moe"], seed=0, meta=True)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["gate_proj", "up_proj", "down_proj"]))
    adapted = [n for n, p in peft.named_parameters() if p.requires_grad]
    assert adapted and not any(".experts." in n for n in adapted)  # the shared expert's only
    plan = Plan.parse("dp=4,ep=2,finetune=lora,lora_targets=mlp,gbs=4,mbs=1,seq_len=32", world_size=4)
    with pytest.raises(PartitaError) as e:
        runtime_check(plan, build_tiny_hf(*TINY_HF_MOE["hf-qwen2-moe"], seed=0, meta=True))
    assert MOE_TARGETS in str(e.value) and "\n" not in str(e.value)
    runtime_check(Plan.parse("dp=4,ep=2,finetune=lora,lora_targets=attention,gbs=4,mbs=1,seq_len=32", world_size=4),
                  build_tiny_hf(*TINY_HF_MOE["hf-qwen2-moe"], seed=0, meta=True))  # attention: runs (dp=4,ep=2 case)


@pytest.mark.parametrize("case", ["dp=2,tp=2", "dp=4,zero=3", "dp=2,pp=2",
                                  "dp=2,pp=2,vpp=2,zero=3,schedule=interleaved-1f1b", "dp=4,ep=2"])
def test_saved_adapter_loads_in_peft_with_partitas_eval_loss(results, case):
    import torch.nn.functional as F
    from peft import PeftModel

    sys.path.insert(0, str(WORKER.parent))
    import lora_runtime_worker as w
    r = results
    adapter = Path(r[case]["adapter_dir"])
    assert adapter.name == w.case_dir(case)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(adapter))
    model = PeftModel.from_pretrained(w.setup(case)[0](False), str(adapter)).eval()
    rows = w.sft_rows(w.STEPS * 4, 32, 256)
    with torch.no_grad():
        logits = [model(input_ids=rows["inputs"][i:i + 1], position_ids=rows["positions"][i:i + 1],
                        use_cache=False).logits for i in range(w.STEPS * 4)]
        losses = [float(F.cross_entropy(out.flatten(0, 1), rows["targets"][i].flatten())) for i, out in enumerate(logits)]
    assert abs(sum(losses) / len(losses) - r[case]["eval_loss"]) <= 1e-5


def _model_dir(root: Path) -> tuple[Path, Path]:
    """A tiny HF Llama directory with weights and a chat tokenizer, and a chat JSONL file."""
    import random

    import transformers
    from partita.train.sft_data import build_chat_tokenizer
    words = "the cat sat on a mat while the dog ran to the park and the bird sang a song".split()
    rng = random.Random(0)
    chats = [{"messages": [{"role": "user", "content": " ".join(rng.choices(words, k=5))},
                           {"role": "assistant", "content": " ".join(rng.choices(words, k=6))}]} for _ in range(40)]
    data = root / "sft.jsonl"
    data.write_text("\n".join(json.dumps(c) for c in chats) + "\n")
    model = root / "model"
    build_chat_tokenizer(model, [m["content"] for c in chats for m in c["messages"]] * 5 + ["user assistant"] * 10, 300)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(model))
    return model, data


def _train(*args: str) -> dict:
    cmd = [sys.executable, "-m", "partita", "train", "--optimizer", "sgd", "--lr", "0.5", "--json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}  # --steps 0 prints no summary


def _eval_loss(model, data: Path, tokenizer: Path, rows: int) -> float:
    """The eval loss as Partita defines it (mean over rows of each row's mean assistant-token
    loss; mbs 1), computed with transformers + PEFT on the rows Partita evaluated."""
    import torch.nn.functional as F
    from partita.train.sft_data import SftRows, encode_file, load_chat_tokenizer
    x, y, pos = SftRows(encode_file(data, load_chat_tokenizer(tokenizer), 64), seed=0).rows(0, rows)
    with torch.no_grad():
        return sum(float(F.cross_entropy(model(input_ids=x[i:i + 1], position_ids=pos[i:i + 1], use_cache=False)
                                         .logits.flatten(0, 1), y[i])) for i in range(rows)) / rows


def test_partita_train_lora_cli_save_load_merge_resume(tmp_path):
    """partita train --finetune lora on chat data under dp=2,tp=2 writes a PEFT adapter that
    transformers + PEFT load with Partita's eval loss; --adapter resumes from it and --merge
    writes merged weights that plain transformers loads with the same loss."""
    import transformers
    from peft import PeftModel
    model_dir, data = _model_dir(tmp_path)
    common = ["--model", str(model_dir), "--finetune", "lora", "--lora-rank", "4", "--lora-alpha", "8",
              "--data", str(data), "--eval-data", str(data), "--eval-batches", "2"]
    adapter = tmp_path / "adapter"
    first = _train(*common, "--plan", "dp=2,tp=2,gbs=4,mbs=1,seq_len=64,dtype=fp32", "--nproc", "4", "--steps", "3",
                   "--save-hf", str(adapter), "--run-dir", str(tmp_path / "run1"))
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(adapter))
    base = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    peft_loss = _eval_loss(PeftModel.from_pretrained(base, str(adapter)).eval(), data, model_dir, 8)
    assert abs(peft_loss - first["eval_loss"]) <= 1e-5, (peft_loss, first)
    merged = tmp_path / "merged"
    _train(*common, "--adapter", str(adapter), "--merge", "--plan", "dp=1,gbs=4,mbs=1,seq_len=64,dtype=fp32",
           "--steps", "0", "--save-hf", str(merged), "--run-dir", str(tmp_path / "run2"))
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(merged)).eval()
    assert abs(_eval_loss(plain, data, model_dir, 8) - first["eval_loss"]) <= 1e-5
