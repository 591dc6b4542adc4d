"""Run under torchrun (4 processes): LoRA through ``parallelize`` under each plan of argv, on
packed SFT rows, against single-process PEFT (``get_peft_model``) trained with SGD on the
same rows from the same base weights and adapters. One process group for all cases: the
suite runs :func:`run_case` in its shared torchrun (tests/conftest.py ``equivalence``).

Models per case (:func:`setup`): the tiny HF Llama (2 layers; 4 for the interleaved
pipeline) on packed rows; under cp the reference tiny-llama on plain token rows (cp runs
reference models; packed rows are refused there); under ep the tiny HF Qwen2-MoE with
attention adapters (the runtime's one LoRA restriction on MoE models, runtime/lora.py).

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

from partita.errors import PartitaError
from partita.models.hf import TINY_BASE, build_hf_from_config, build_tiny_hf
from partita.models.llama import build_model
from partita.models.registry import TINY_HF_MOE
from partita.plan import Plan
from partita.runtime.lora import adapter_state, lora_config, lora_init, merged_state, peft_key, save_adapter
from partita.runtime.parallelize import parallelize
from partita.train.sft_data import evaluate_sft, pack

LLAMA = ("LlamaConfig", "LlamaForCausalLM", {})
LORA = "dtype=fp32,finetune=lora,lora_rank=4,lora_alpha=8.0,gbs=4,mbs=1,seq_len=32"
STEPS, LR = 3, 0.5


def llama4(meta: bool = False):
    """The tiny HF Llama with 4 layers (an interleaved pipeline of pp=2, vpp=2 needs 4 stages)."""
    import transformers
    return build_hf_from_config(transformers.LlamaConfig(**{**TINY_BASE, "num_hidden_layers": 4}),
                                transformers.LlamaForCausalLM, 0, meta)


DEFAULT = (lambda meta: build_tiny_hf(*LLAMA, seed=0, meta=meta), "", True)


def setup(text: str) -> tuple:
    """(model builder (meta), plan text added, packed rows) of a case: an interleaved
    pipeline gets the 4-layer Llama, cp the reference tiny-llama on token rows (``hf:``
    before the plan: the 2-layer HF Llama on token rows), ep the Qwen2-MoE with attention
    adapters, every other case the 2-layer HF Llama."""
    if text.startswith("hf:"):
        return DEFAULT[0], "", False
    fields = dict(kv.split("=") for kv in text.split(","))
    if int(fields.get("vpp", 1)) > 1:
        return llama4, "", True
    if int(fields.get("cp", 1)) > 1:
        return lambda meta: build_model("tiny-llama", seed=0, device="meta" if meta else "cpu"), "", False
    if int(fields.get("ep", 1)) > 1:
        return (lambda meta: build_tiny_hf(*TINY_HF_MOE["hf-qwen2-moe"], seed=0, meta=meta),
                ",lora_targets=attention", True)
    return DEFAULT


def token_rows(n_rows: int, seq_len: int, vocab: int) -> dict:
    """Plain next-token rows (every target counted): what context parallel trains on."""
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, vocab, (n_rows, seq_len + 1), generator=g)
    return {"inputs": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


def case_dir(text: str) -> str:
    return text.replace(",", "_").replace("=", "").replace(":", "_")


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


def reference(plan: Plan, rows: dict, build=DEFAULT[0]):
    """Single-process PEFT (``get_peft_model`` on the whole model, no parallelism) with the
    adapters' initial values set to Partita's."""
    from peft import get_peft_model
    model = build(False)
    peft_model = get_peft_model(model, lora_config(model, plan))
    initial = {}
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if p.requires_grad:
                p.copy_(lora_init(name.removeprefix("base_model.model."), tuple(p.shape), 0))
                initial[peft_key(name.removeprefix("base_model.model."))] = p.detach().clone()
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    opt = torch.optim.SGD([p for p in peft_model.parameters() if p.requires_grad], lr=LR)
    losses = []
    for step in range(STEPS):
        sl = slice(step * plan.gbs, (step + 1) * plan.gbs)
        total = 0.0
        for i in range(plan.gbs):  # each (dp rank, micro-batch) chunk of one row: the runtime's mean of means
            x, y = rows["inputs"][sl][i:i + 1], rows["targets"][sl][i:i + 1]
            if "positions" in rows:
                out = peft_model(input_ids=x, position_ids=rows["positions"][sl][i:i + 1], use_cache=False).logits
            else:  # token rows: a reference model's forward gives logits, an HF model's an output
                out = peft_model(x)
                out = getattr(out, "logits", out)
            loss = F.cross_entropy(out.flatten(0, 1), y.flatten())
            (loss / plan.gbs).backward()
            total += float(loss) / plan.gbs
        opt.step()
        opt.zero_grad()
        losses.append(total)
    adapters = {peft_key(n.removeprefix("base_model.model.")): p.detach() for n, p in peft_model.named_parameters()
                if p.requires_grad}
    merged = {k: v.detach().clone() for k, v in peft_model.merge_and_unload().state_dict().items()}
    return losses, adapters, trainable, initial, merged


def _named(pm) -> dict:
    """This rank's parameters (every pipeline stage it holds), whole where DTensors."""
    return {n.replace("_checkpoint_wrapped_module.", ""): (p.full_tensor() if isinstance(p, DTensor) else p).detach()
            for mod in pm.modules for n, p in mod.named_parameters()}


def _packed_cp_refusal(pm, rows: dict) -> str:
    """The one-line refusal of packed rows under context parallel (raised before any collective)."""
    rows = _ROWS.setdefault("rows", sft_rows(STEPS * 4, 32, 256))
    per = pm.plan.gbs // pm.plan.dp
    try:
        pm.train_step(rows["inputs"][:per], rows["targets"][:per], rows["positions"][:per])
    except PartitaError as e:
        return str(e)
    return ""


#: the packed rows every case trains on (built on first use)
_ROWS: dict = {}


def run_case(text: str, rows: dict | None = None, out_dir: str | None = None) -> dict:
    """One plan's LoRA run against PEFT. Without ``rows`` / ``out_dir`` (the suite's shared
    torchrun, tests/conftest.py): the rows of :func:`main`, the adapter saved under
    ``PARTITA_WORKER_DIR``; the result names the adapter's folder (``adapter_dir``)."""
    build, extra, packed = setup(text)
    if rows is None or not packed:
        rows = _ROWS.setdefault("rows", sft_rows(STEPS * 4, 32, 256)) if packed else token_rows(STEPS * 4, 32, 256)
    out_dir = out_dir or os.environ["PARTITA_WORKER_DIR"]
    plan = Plan.parse(f"{text.removeprefix('hf:')},{LORA}{extra}", world_size=dist.get_world_size())
    pm = parallelize(build(True), plan, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=LR), max_grad_norm=None)
    per = plan.gbs // plan.dp
    from partita.runtime.batches import dp_index
    start = dp_index(plan, dist.get_rank()) * per
    base0 = {n: v.clone() for n, v in _named(pm).items() if ".lora_" not in n}
    keys = ("inputs", "targets", "positions") if packed else ("inputs", "targets")
    batches = [tuple(rows[k][s * plan.gbs + start: s * plan.gbs + start + per] for k in keys) for s in range(STEPS)]
    losses = [pm.train_step(*batch) for batch in batches]
    full = _named(pm)
    base_changed = max(float((full[n] - v).abs().max()) for n, v in base0.items())
    trainable = torch.tensor([sum(p.numel() for p in pm.parameters() if p.requires_grad)])  # DTensor: global numel
    if pm.pp_group is not None:  # every stage's adapters
        dist.all_reduce(trainable, group=pm.pp_group)
    save_adapter(pm, os.path.join(out_dir, case_dir(text)), pm.lora_config, None)
    mine = adapter_state(pm)  # the saved tensors: every stage's on rank 0
    merged = merged_state(pm, pm.lora_config) if plan.pp > 1 else None
    result = {"losses": losses, "base_changed": base_changed, "trainable": int(trainable),
              "adapter_dir": os.path.join(out_dir, case_dir(text))}
    if packed:
        result["eval_loss"] = evaluate_sft(pm, batches)
    elif plan.cp > 1:
        result["packed_cp_refusal"] = _packed_cp_refusal(pm, rows)
    if dist.get_rank() == 0:
        ref_losses, adapters, ref_trainable, initial, ref_merged = reference(plan, rows, build)
        if merged is not None:  # --merge under pp: every stage's merged weights, gathered
            result.update(merged_keys_match=sorted(merged) == sorted(ref_merged),
                          merged_max_diff=max(float((merged[k] - ref_merged[k]).abs().max()) for k in merged))
        result.update(ref_losses=ref_losses, ref_trainable=ref_trainable, adapters_compared=len(mine),
                      adapter_keys_match=sorted(mine) == sorted(adapters),
                      adapter_max_diff=max(float((mine[k] - adapters[k]).abs().max()) for k in mine),
                      adapter_moved=max(float((mine[k] - initial[k]).abs().max()) for k in mine))
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
