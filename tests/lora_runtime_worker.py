"""Run under torchrun (4 processes): LoRA through ``parallelize`` under each plan of argv, on
packed SFT rows, against single-process PEFT (``get_peft_model``) trained with SGD on the
same rows from the same base weights and adapters. One process group for all cases: the
suite runs :func:`run_case` in its shared torchrun (tests/conftest.py ``equivalence``).

Usage: python -m torch.distributed.run --nproc-per-node 4 tests/lora_runtime_worker.py OUT.json PLAN...
Writes {plan: {"losses", "ref_losses", "adapter_max_diff", "base_changed", "trainable"}} from rank 0.
"""
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from partita.models.hf import build_tiny_hf
from partita.plan import Plan
from partita.runtime.lora import lora_config, lora_init, save_adapter
from partita.runtime.parallelize import parallelize
from partita.train.sft_data import evaluate_sft, pack

LLAMA = ("LlamaConfig", "LlamaForCausalLM", {})
LORA = "dtype=fp32,finetune=lora,lora_rank=4,lora_alpha=8.0,gbs=4,mbs=1,seq_len=32"
STEPS, LR = 3, 0.5


def case_dir(text: str) -> str:
    return text.replace(",", "_").replace("=", "")


def sft_rows(n_rows: int, seq_len: int, vocab: int) -> dict:
    """Packed rows of random 'conversations': a prompt (no loss) then an answer (loss)."""
    g = torch.Generator().manual_seed(7)
    samples = []
    while len(samples) < 8 * n_rows:
        p, a = int(torch.randint(2, 8, (1,), generator=g)), int(torch.randint(2, 8, (1,), generator=g))
        ids = torch.randint(0, vocab, (p + a,), generator=g)
        y = ids[1:].clone()
        y[:p - 1] = -100
        samples.append((ids[:-1].numpy(), y.numpy()))
    rows = pack(samples, seq_len, 0)
    return {k: torch.from_numpy(v[:n_rows]) for k, v in rows.items()}


def reference(plan: Plan, rows: dict):
    """Single-process PEFT with the adapters' initial values set to Partita's."""
    from peft import get_peft_model
    model = build_tiny_hf(*LLAMA, seed=0)
    peft_model = get_peft_model(model, lora_config(model, plan))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if p.requires_grad:
                p.copy_(lora_init(name.removeprefix("base_model.model."), tuple(p.shape), 0))
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=LR)
    losses = []
    for step in range(STEPS):
        sl = slice(step * plan.gbs, (step + 1) * plan.gbs)
        total = 0.0
        for i in range(plan.gbs):  # each (dp rank, micro-batch) chunk of one row: the runtime's mean of means
            x, y, pos = (rows[k][sl][i:i + 1] for k in ("inputs", "targets", "positions"))
            out = peft_model(input_ids=x, position_ids=pos, use_cache=False).logits
            loss = F.cross_entropy(out.flatten(0, 1), y.flatten())
            (loss / plan.gbs).backward()
            total += float(loss) / plan.gbs
        opt.step()
        opt.zero_grad()
        losses.append(total)
    adapters = {n.removeprefix("base_model.model."): p.detach() for n, p in peft_model.named_parameters()
                if p.requires_grad}
    return losses, adapters, trainable


#: the packed rows every case trains on (built on first use)
_ROWS: dict = {}


def run_case(text: str, rows: dict | None = None, out_dir: str | None = None) -> dict:
    """One plan's LoRA run against PEFT. Without ``rows`` / ``out_dir`` (the suite's shared
    torchrun, tests/conftest.py): the rows of :func:`main`, the adapter saved under
    ``PARTITA_WORKER_DIR``; the result names the adapter's folder (``adapter_dir``)."""
    if rows is None:
        rows = _ROWS.setdefault("rows", sft_rows(STEPS * 4, 32, 256))
    out_dir = out_dir or os.environ["PARTITA_WORKER_DIR"]
    plan = Plan.parse(f"{text},{LORA}", world_size=dist.get_world_size())
    model = build_tiny_hf(*LLAMA, seed=0, meta=True)
    pm = parallelize(model, plan, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=LR), max_grad_norm=None)
    per = plan.gbs // plan.dp
    from partita.runtime.batches import dp_index
    start = dp_index(plan, dist.get_rank()) * per
    base0 = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
             for n, p in pm.model.named_parameters() if ".lora_" not in n}
    losses = []
    for step in range(STEPS):
        sl = slice(step * plan.gbs + start, step * plan.gbs + start + per)
        losses.append(pm.train_step(rows["inputs"][sl], rows["targets"][sl], rows["positions"][sl]))
    full = {n.replace("_checkpoint_wrapped_module.", ""): (p.full_tensor() if isinstance(p, DTensor) else p).detach()
            for n, p in pm.model.named_parameters()}
    base_changed = max(float((full[n] - v).abs().max()) for n, v in base0.items())
    trainable = sum(p.numel() for p in pm.model.parameters() if p.requires_grad)  # DTensor: the global numel
    save_adapter(pm, os.path.join(out_dir, case_dir(text)), pm.lora_config, None)
    keys = ("inputs", "targets", "positions")
    evals = [tuple(rows[k][s * plan.gbs + start: s * plan.gbs + start + per] for k in keys) for s in range(STEPS)]
    result = {"losses": losses, "base_changed": base_changed, "trainable": trainable,
              "eval_loss": evaluate_sft(pm, evals), "adapter_dir": os.path.join(out_dir, case_dir(text))}
    if dist.get_rank() == 0:
        ref_losses, adapters, ref_trainable = reference(plan, rows)
        mine = {n: v for n, v in full.items() if ".lora_" in n}
        result.update(ref_losses=ref_losses, ref_trainable=ref_trainable, adapters_compared=len(mine),
                      adapter_max_diff=max(float((mine[n] - adapters[n]).abs().max()) for n in mine),
                      adapter_moved=max(float((mine[n] - lora_init(n, tuple(mine[n].shape), 0)).abs().max())
                                        for n in mine))
    return result


def main() -> None:
    out, cases = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rows = sft_rows(STEPS * 4, 32, 256)
    results = {}
    for text in cases:
        results[text] = run_case(text, rows, os.path.dirname(out))
        dist.barrier()
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
