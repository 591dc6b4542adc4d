"""Measured vs predicted peak memory of LoRA and full SFT on the CPU (issue 36 item 5).

    python tests/measure_lora_memory.py          # prints one JSON line per run

One process (a 1-rank gloo group) trains a small HF Llama (config written to a temp dir)
through :func:`partita.parallelize` with fp32 AdamW on packed rows, once with
``finetune=lora`` (PEFT r=16, all linears) and once with ``finetune=full``. Measured peak =
the bytes alive before the step (parameters, optimizer states: summed from the tensors
themselves) + the peak of the running sum of the allocator's alloc/free events during the
second step (torch.profiler ``profile_memory=True``, the method of
tests/measure_memory_physics.py). Predicted = ``partita estimate --hardware cpu --framework
partita --json`` for the same model and plan (``peak_memory_gib``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=8192, hidden_size=512,
              intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
              max_position_embeddings=1024, tie_word_embeddings=False, rms_norm_eps=1e-6, torch_dtype="float32")
PLAN = "dp=1,gbs=2,mbs=2,seq_len=512,dtype=fp32,recompute=none"


def peak_live_bytes(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def measure(config_path: Path, finetune: str) -> float:
    from partita.models.hf import build_hf_dir
    from partita.plan import Plan
    from partita.runtime.parallelize import parallelize
    plan = Plan.parse(f"{PLAN},finetune={finetune},lora_rank=16", world_size=1)
    model = build_hf_dir(config_path.parent, seed=0, meta=True)
    pm = parallelize(model, plan, make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=False))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, CONFIG["vocab_size"], (plan.gbs, plan.seq_len), generator=g)
    pos = torch.arange(plan.seq_len).repeat(plan.gbs, 1)
    pos[:, plan.seq_len // 2:] -= plan.seq_len // 2  # two samples per row
    pm.train_step(x, x, pos)  # optimizer states exist from here
    static = sum(p.numel() * p.element_size() for p in pm.parameters())
    static += sum(t.numel() * t.element_size() for s in pm.optimizer.state.values() for t in s.values()
                  if isinstance(t, torch.Tensor))
    return (static + peak_live_bytes(lambda: pm.train_step(x, x, pos))) / 2 ** 30


def predicted(config_path: Path, finetune: str) -> tuple[float, float]:
    """(peak, peak without the hardware file's fixed runtime context): the allocator sees no context."""
    cmd = [sys.executable, "-m", "partita", "estimate", "--model", str(config_path), "--hardware", "cpu",
           "--devices", "1", "--framework", "partita", "--plan", f"{PLAN},finetune={finetune},lora_rank=16", "--json"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout)
    context = float(out["memory"].get("runtime (context, workspaces)", 0.0))
    return float(out["peak_memory_gib"]), float(out["peak_memory_gib"]) - context


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timedelta(seconds=120))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(CONFIG))
        for finetune in ("lora", "full"):
            got, (want, want_alloc) = measure(path, finetune), predicted(path, finetune)
            print(json.dumps({"finetune": finetune, "plan": PLAN, "measured_gib": round(got, 4),
                              "predicted_gib": round(want, 4), "predicted_without_context_gib": round(want_alloc, 4),
                              "ratio_without_context": round(want_alloc / got, 3)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
