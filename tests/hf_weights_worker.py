"""torchrun worker of tests/test_hf_weights.py: HF weights loaded shard by shard, then saved.

For each ``MODEL_DIR|PLAN`` case every rank builds the model on the meta device, applies
the plan, reads only its own slices of the safetensors files, evaluates one batch through
the parallel model (forward only) and writes the model back with ``save_hf_weights``.
Rank 0 compares with transformers itself: the loss of ``from_pretrained(MODEL_DIR)`` on
the same batch, and every tensor of ``from_pretrained(OUT)`` against the source model.
Usage: ``torchrun --nproc-per-node=4 tests/hf_weights_worker.py RESULTS.json OUT_ROOT CASE...``; the
suite runs :func:`run_case` in its shared torchrun instead (tests/conftest.py ``equivalence``).
"""
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False)
TEXT = " ".join(f"the {w} number {i} goes to the market and buys {i % 7} apples." for i, w in
                enumerate(["cat", "dog", "bird", "fish"] * 300))


def hf_dir(root: Path, kind: str) -> Path:
    """A tiny HF model written by transformers (5 KB shards: several files and an index) with
    a tokenizer.json trained on the corpus."""
    from partita.train.data import train_tokenizer
    import transformers
    configs = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
               "mixtral": lambda **kw: transformers.MixtralConfig(**kw, num_local_experts=4, num_experts_per_tok=2)}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[kind](**COMMON))
    out = root / kind
    model.save_pretrained(out, max_shard_size="100KB")
    train_tokenizer([TEXT], 300).save(str(out / "tokenizer.json"))
    return out


def case(model_dir: str, plan_text: str, out: Path) -> dict:
    from partita.models.hf_weights import build_hf_meta, load_hf_weights, materialize, save_hf_weights
    from partita.plan import Plan
    from partita.runtime.batches import dp_shard, synthetic_batch
    from partita.runtime.parallelize import parallelize
    from partita.train.evaluate import evaluate
    model = materialize(build_hf_meta(model_dir), torch.device("cpu"))
    config, vocab = model.config, model.partita_vocab
    plan = Plan.parse(plan_text, world_size=dist.get_world_size())
    pm = parallelize(model, plan, make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0), device_type="cpu")
    load_hf_weights(pm, model_dir, bool(config.tie_word_embeddings))
    x, y = synthetic_batch(0, plan.gbs, plan.seq_len, vocab, 0)
    rank = dist.get_rank()
    got = evaluate(pm, [(dp_shard(x, plan, rank), dp_shard(y, plan, rank))])
    save_hf_weights(pm, out, config, max_shard_bytes=40_000, source=model_dir)
    if rank != 0:
        return {}
    import transformers
    src = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        want = float(F.cross_entropy(src(input_ids=x).logits.flatten(0, 1), y.flatten()))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    ref = src.state_dict()
    diff = max(float((back[k] - v).abs().max()) for k, v in ref.items())
    return {"loss": got, "hf_loss": want, "max_weight_diff": diff, "same_names": sorted(back) == sorted(ref),
            "files": sorted(p.name for p in out.iterdir())}


def run_case(text: str) -> dict:
    """A ``KIND|PLAN`` case in the suite's shared torchrun (tests/conftest.py): rank 0 writes
    the tiny HF model of KIND (:func:`hf_dir`) under ``PARTITA_WORKER_DIR`` first."""
    kind, plan_text = text.split("|")
    root = Path(os.environ["PARTITA_WORKER_DIR"]) / "hf_weights"
    if dist.get_rank() == 0 and not (root / kind).exists():
        hf_dir(root, kind)
    dist.barrier()
    return case(str(root / kind), plan_text, root / ("out_" + plan_text.replace(",", "_").replace("=", "")))


def main() -> None:
    results_path, out_root, cases = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    results = {}
    for i, text in enumerate(cases):
        model_dir, plan_text = text.split("|")
        results[text] = case(model_dir, plan_text, out_root / f"case{i}")
    if dist.get_rank() == 0:
        Path(results_path).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
