"""Measure the cost model's terms with torch and record them as test data.

    python bench/record_cost_oracles.py            # writes tests/data/cost_oracles.json (a few minutes)
    python bench/record_cost_oracles.py --check    # measures again, prints differences, writes nothing

Issue 12, item 1: every cost term against an oracle from outside the cost model. The
planning test ``tests/test_cost_oracles.py`` compares the cost model with the figures
recorded here without importing torch; ``tests/test_cost_oracles_current.py`` re-measures
a subset with torch and checks that the recording is current.

Three oracles, all on the reference models of :mod:`partita.models` (LLaMA-style dense
and MoE; they have no MLA, so MLA is not measured):

* **FLOPs** - ``torch.utils.flop_counter.FlopCounterMode``, per module, forward and
  forward + backward. Convention (torch 2.13): the counter has no formula for the CPU
  flash kernel ``_scaled_dot_product_flash_attention_for_cpu`` (it counts 0), and its
  SDPA formulas ignore ``is_causal``. So attention is measured with the MATH backend,
  where ``QK^T`` and ``AV`` are ``bmm``s over the *full* ``s x s`` score matrix, and is
  recorded as that full (non-causal) count ``attention_core_full``; a causal mask leaves
  ``s(s+1)/2`` of the ``s^2`` (query, key) pairs, so the causal figure is
  ``full * (s+1) / (2s)`` exactly (the planning test applies that factor).
  Training FLOPs (``layer_train``, per recompute mode) run the runtime's own kernel (the
  CPU flash kernel, which selective recompute's policy keys on), counted with torch's
  formulas for the fused SDPA kernels mapped onto it (:data:`FLASH_CPU`): forward 2 bmm,
  backward 5 (flash recomputes the scores), so attention's backward is 2.5x its forward;
  the GEMMs and the attention kernel are recorded apart. Embedding lookups and the
  cross-entropy loss count 0 FLOPs (the counter counts matmul-like ops only); they are
  recorded too.
  Tensor parallelism: the layer is rebuilt with its tp-local shapes (q/k/v/w1/w3 outputs
  and wo/w2 inputs divided by tp, vocab by tp), which is what each rank of the runtime's
  Megatron layout (runtime/tensor_parallel.py) multiplies.
* **Activation bytes** of one layer per micro-batch, for recompute none / selective /
  full as the runtime applies it (:func:`partita.runtime.recompute.apply_recompute`):
  the storages created during the layer's forward that are still alive after it
  (weak references on every op output, through a dispatch mode), the layer's output
  excepted - this sees what autograd saves *and* what checkpointing keeps in its own
  frames, which saved-tensor hooks cannot. For recompute none the figure is
  cross-checked against ``torch.autograd.graph.saved_tensors_hooks`` counting unique
  storages (recorded as ``saved_hooks_bytes``). bf16 is measured with the model in bf16
  (as FSDP2's mixed precision runs it), not autocast.
* **Model states per rank** on gloo (``torchrun``): the bytes of the parameters (local
  shards of DTensors / FSDP), of ``.grad`` when the optimizer steps, and of the AdamW
  state (``exp_avg``, ``exp_avg_sq``; the scalar ``step`` tensors recorded apart), for
  every layout the runtime runs today (``runtime_check``).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from partita.models.llama import MODEL_PRESETS, MoE, Transformer, build_model  # noqa: E402
from partita.runtime.recompute import apply_recompute  # noqa: E402

DATA = ROOT / "tests" / "data" / "cost_oracles.json"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

#: (model, seq_len, mbs, tp) of the FLOP measurements. MoE layers are measured at tp=1:
#: the runtime does not tensor-split MoE blocks.
FLOP_CASES = [(m, s, b, tp) for m in ("tiny-llama", "small-llama") for s in (16, 64) for b in (1, 2)
              for tp in (1, 2)] + [("small-llama", 64, 1, 4)] + \
             [("tiny-moe", s, b, 1) for s in (16, 64) for b in (1, 2)]
#: (model, seq_len, mbs, tp, dtype, recompute) of the activation measurements (tp: sp=false).
ACT_CASES = [(m, s, b, 1, d, rc) for m in ("tiny-llama", "small-llama", "tiny-moe") for s, b in ((16, 1), (64, 2))
             for d in ("fp32", "bf16") for rc in ("none", "selective", "full")] + \
            [(m, 64, 1, 2, "fp32", rc) for m in ("tiny-llama", "small-llama") for rc in ("none", "selective", "full")]
SEQ = "gbs={gbs},mbs=1,seq_len=16"
#: world size -> (model, plan) of the model-state measurements
STATE_CASES = {
    2: [("tiny-llama", f"dp=2,zero={z},dtype=fp32," + SEQ.format(gbs=2)) for z in (0, 1, 2, 3)]
    + [("tiny-llama", f"dp=2,zero={z},dtype=bf16," + SEQ.format(gbs=2)) for z in (0, 1, 2, 3)]
    + [("tiny-llama", "tp=2,sp=true,zero=1,dtype=fp32," + SEQ.format(gbs=1)),
       ("tiny-llama", "pp=2,zero=1,dtype=fp32," + SEQ.format(gbs=2)),
       ("tiny-moe", "dp=2,ep=2,zero=0,dtype=fp32," + SEQ.format(gbs=2)),
       ("tiny-moe", "dp=2,ep=2,zero=1,dtype=fp32," + SEQ.format(gbs=2)),
       ("tiny-llama+tied", "dp=2,zero=1,dtype=fp32," + SEQ.format(gbs=2)),
       ("tiny-llama+tied", "pp=2,zero=1,dtype=fp32," + SEQ.format(gbs=2))],
    4: [("tiny-llama", "dp=4,zero=1,dtype=fp32," + SEQ.format(gbs=4)),
        ("tiny-llama", "dp=4,zero=3,dtype=fp32," + SEQ.format(gbs=4)),
        ("tiny-llama", "dp=2,tp=2,zero=1,dtype=fp32," + SEQ.format(gbs=2)),
        ("tiny-llama", "pp=2,dp=2,zero=1,dtype=fp32," + SEQ.format(gbs=4)),
        ("tiny-moe", "dp=4,ep=2,zero=1,dtype=fp32," + SEQ.format(gbs=4)),
        ("tiny-llama", "dp=4,zero=3,dp_shard=2,dtype=fp32," + SEQ.format(gbs=4)),  # HSDP
        ("tiny-llama", "cp=2,dp=2,zero=1,dtype=fp32," + SEQ.format(gbs=2)),
        ("tiny-llama", "cp=2,dp=2,zero=3,dtype=fp32," + SEQ.format(gbs=2)),
        ("tiny-moe", "dp=4,ep=2,zero=3,dtype=fp32," + SEQ.format(gbs=4)),
        ("tiny-moe", "dp=2,ep=2,tp=2,zero=1,dtype=fp32," + SEQ.format(gbs=2)),
        ("tiny-moe", "dp=2,ep=2,pp=2,zero=1,dtype=fp32," + SEQ.format(gbs=4))],
}


# ----------------------------------------------------------------------------- models
def reference_model(name: str) -> Transformer:
    """A reference model by preset name; ``<preset>+tied`` ties its output layer to the
    embedding (no preset is tied, and the cost model treats tied weights apart)."""
    base, _, variant = name.partition("+")
    cfg = MODEL_PRESETS[base]
    if variant == "tied":
        cfg = dataclasses.replace(cfg, tied_embeddings=True)
    elif variant:
        raise ValueError(f"unknown model variant {variant!r}")
    return build_model(cfg, seed=0)


def one_layer_model(name: str, tp: int = 1) -> Transformer:
    """The reference model ``name`` with one layer, rebuilt with the tp-local shapes one
    rank of the runtime's Megatron layout multiplies (column-parallel outputs and
    row-parallel inputs divided by ``tp``; the output layer's vocab too)."""
    cfg = dataclasses.replace(MODEL_PRESETS[name], layers=1)
    model = build_model(cfg)
    if tp == 1:
        return model
    h, hd = cfg.hidden, cfg.head_dim
    q, kv, f = cfg.heads * hd // tp, cfg.kv_heads * hd // tp, cfg.ffn_hidden // tp
    for block in model.layers.values():
        att = block.attention
        att.wq, att.wk, att.wv, att.wo = (nn.Linear(h, q, bias=False), nn.Linear(h, kv, bias=False),
                                          nn.Linear(h, kv, bias=False), nn.Linear(q, h, bias=False))
        if isinstance(block.feed_forward, MoE):
            raise ValueError("the runtime does not tensor-split MoE blocks")
        ff = block.feed_forward
        ff.w1, ff.w3, ff.w2 = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)
    model.output = nn.Linear(h, cfg.vocab // tp, bias=False)
    return model


def _block(model: Transformer) -> nn.Module:
    return model.layers["0"]


def _hidden(model: Transformer, seq: int, mbs: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(mbs, seq, model.cfg.hidden, generator=g).to(dtype).requires_grad_()


# ----------------------------------------------------------------------------- FLOPs
def _by_module(counter: FlopCounterMode, prefix: str) -> dict[str, int]:
    """FLOPs per module name (below ``prefix``) of a counter's run."""
    return {name.removeprefix(prefix): int(sum(ops.values())) for name, ops in counter.get_flop_counts().items()
            if name.startswith(prefix)}


def _layer_forward_flops(model: Transformer, x: torch.Tensor) -> tuple[dict[str, int], int]:
    """Forward FLOPs of one layer by part (MATH attention), and the backward's total."""
    block = _block(model)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fwd:
        y = block(x, model.rope_cos, model.rope_sin)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    m = _by_module(fwd, type(block).__name__ + ".")
    proj = sum(m.get(f"attention.{w}", 0) for w in ("wq", "wk", "wv", "wo"))
    parts = {"attention_proj": proj, "attention_core_full": m["attention"] - proj}
    if isinstance(block.feed_forward, MoE):
        parts.update(router=m["feed_forward.router"], experts=m["feed_forward.experts"],
                     shared=m.get("feed_forward.shared", 0))
        parts["moe_other"] = m["feed_forward"] - parts["router"] - parts["experts"] - parts["shared"]
    else:
        parts["mlp"] = m["feed_forward"]
    parts["layer_total"] = int(fwd.get_total_flops())
    return parts, int(bwd.get_total_flops())


#: torch's own formulas for the fused (flash) SDPA kernels, mapped onto the CPU flash
#: kernel the runtime runs (the counter registers the GPU kernels only): forward 2 bmm
#: over the full scores, backward 5 (the kernel recomputes the scores).
FLASH_CPU = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu:
        lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v),
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
        lambda g, q, k, v, *args, out_shape=None, **kwargs: sdpa_backward_flop_count(g, q, k, v),
}


def _layer_train_flops(name: str, tp: int, seq: int, mbs: int, recompute: str) -> dict[str, int]:
    """Forward + backward FLOPs of one layer with the runtime's recompute applied and its
    attention kernel (CPU flash): the GEMMs, and the attention kernel's (full scores)."""
    model = one_layer_model(name, tp)
    apply_recompute(model, recompute)
    x = _hidden(model, seq, mbs)
    with FlopCounterMode(display=False, custom_mapping=FLASH_CPU) as counter:
        _block(model)(x, model.rope_cos, model.rope_sin).sum().backward()
    by_op = counter.get_flop_counts()["Global"]
    attention = sum(n for op, n in by_op.items() if "flash_attention" in str(op))
    return {"gemm": int(counter.get_total_flops()) - attention, "attention_full": attention}


def _ends_flops(model: Transformer, seq: int, mbs: int) -> dict[str, int]:
    """Embedding, output layer (final norm + projection) and loss: forward and backward."""
    tokens = torch.randint(0, model.cfg.vocab, (mbs, seq), generator=torch.Generator().manual_seed(2))
    with FlopCounterMode(display=False) as emb:
        e = model.tok_embeddings(tokens)
    with FlopCounterMode(display=False) as emb_b:
        e.sum().backward()
    h = _hidden(model, seq, mbs)
    with FlopCounterMode(display=False) as out_f:
        logits = model.output(model.norm(h))
    with FlopCounterMode(display=False) as loss_f:
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.flatten() % logits.shape[-1])
    with FlopCounterMode(display=False) as loss_b:
        grad_logits, = torch.autograd.grad(loss, logits, retain_graph=True)
    with FlopCounterMode(display=False) as out_b:
        logits.backward(grad_logits)
    return {"embedding_forward": int(emb.get_total_flops()), "embedding_backward": int(emb_b.get_total_flops()),
            "output_forward": int(out_f.get_total_flops()), "output_backward": int(out_b.get_total_flops()),
            "loss_forward": int(loss_f.get_total_flops()), "loss_backward": int(loss_b.get_total_flops())}


def measure_flops(name: str, seq: int, mbs: int, tp: int) -> dict:
    """Every FLOP figure of one (model, seq, mbs, tp) configuration."""
    torch.manual_seed(0)
    model = one_layer_model(name, tp)
    forward, backward = _layer_forward_flops(model, _hidden(model, seq, mbs))
    return {"model": name, "seq_len": seq, "mbs": mbs, "tp": tp,
            "layer_forward": forward, "layer_backward_total": backward,
            "layer_train": {rc: _layer_train_flops(name, tp, seq, mbs, rc)
                                 for rc in ("none", "selective", "full")},
            **_ends_flops(model, seq, mbs)}


# ----------------------------------------------------------------------------- activations
class _Created(TorchDispatchMode):
    """Weak references to the storage of every op output while active."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[StorageWeakRef, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                s = t.untyped_storage()
                if s.nbytes():
                    self.refs.append((StorageWeakRef(s), s.data_ptr(), s.nbytes()))
        return out

    def alive(self, exclude: set[int]) -> int:
        """Bytes of the distinct storages still alive, those at ``exclude`` addresses aside."""
        live = {ptr: n for ref, ptr, n in self.refs if not ref.expired() and ptr not in exclude}
        return sum(live.values())


def _saved_hooks_bytes(block: nn.Module, x: torch.Tensor, cos, sin, fixed: set[int]) -> int:
    """Unique storages autograd saves during the forward (parameters and buffers aside)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s.data_ptr() not in fixed:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = block(x * 1, cos, sin)
    del y
    return sum(seen.values())


def measure_activations(name: str, seq: int, mbs: int, tp: int, dtype: str, recompute: str) -> dict:
    """Bytes one layer keeps for its backward, per micro-batch, as the runtime runs it."""
    torch.manual_seed(0)
    model = one_layer_model(name, tp).to(DTYPES[dtype])
    apply_recompute(model, recompute)
    block = _block(model)
    leaf = _hidden(model, seq, mbs, DTYPES[dtype])
    cos, sin = model.rope_cos, model.rope_sin
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), leaf]}
    gc.collect()
    with _Created() as created:
        x = leaf * 1  # a non-leaf input, alive afterwards only if the layer keeps it
        y = block(x, cos, sin)
    del x
    gc.collect()
    kept = created.alive(fixed | {y.untyped_storage().data_ptr()})
    out = {"model": name, "seq_len": seq, "mbs": mbs, "tp": tp, "sp": False, "dtype": dtype, "recompute": recompute,
           "bytes": kept}
    del y
    if recompute == "none":
        out["saved_hooks_bytes"] = _saved_hooks_bytes(block, leaf, cos, sin, fixed)
    return out


# ----------------------------------------------------------------------------- model states (gloo)
def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _optimizers(opt) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside the runtime's (combined, sharded, wrapped) optimizer."""
    if isinstance(opt, torch.optim.Optimizer):
        return [opt]
    out = []
    for part in getattr(opt, "parts", [opt]):
        inner = getattr(part, "optimizer", None)
        if inner is not None:
            out.append(inner)
    return out


def _state_case(model_name: str, plan_text: str) -> dict:
    """One training step of ``plan_text`` on this rank; the bytes it holds."""
    import torch.distributed as dist
    from partita.plan import Plan, axis_index
    from partita.runtime.parallelize import parallelize
    from partita.train.data import dp_shard, synthetic_batch

    plan = Plan.parse(plan_text, world_size=dist.get_world_size())
    model = reference_model(model_name)
    vocab = model.cfg.vocab
    pm = parallelize(model, plan)
    rank = dist.get_rank()
    at_rest = list(pm.parameters())
    weights = _storage_bytes(at_rest)
    seen: dict[str, int] = {"weights_after_forward": 0}

    def after_forward(module, args, output):  # FSDP: unsharded parameters are registered now
        held = _storage_bytes(at_rest + [p for mod in pm.modules for p in mod.parameters()])
        seen["weights_after_forward"] = max(seen["weights_after_forward"], held)

    hooks = [mod.register_forward_hook(after_forward) for mod in pm.modules]
    step = pm.optimizer.step

    def counting_step():
        seen["gradients"] = _storage_bytes([p.grad for p in pm.parameters()])
        step()

    pm.optimizer.step = counting_step
    x, y = synthetic_batch(0, plan.gbs, plan.seq_len, vocab, 0)
    pm.train_step(dp_shard(x, plan, rank), dp_shard(y, plan, rank))
    for hook in hooks:
        hook.remove()
    states = [v for o in _optimizers(pm.optimizer) for st in o.state.values() for k, v in st.items()
              if torch.is_tensor(v) and k != "step"]
    steps = [v for o in _optimizers(pm.optimizer) for st in o.state.values() for k, v in st.items()
             if torch.is_tensor(v) and k == "step"]
    return {"rank": rank, "pp_rank": axis_index(plan, "pp", rank), "weights": weights,
            "weights_after_forward": seen["weights_after_forward"], "gradients": seen["gradients"], "optimizer": _storage_bytes(states),
            "optimizer_step_scalars": _storage_bytes(steps)}


def states_worker(out_path: str, cases: list[str]) -> None:
    """Under torchrun: every case in one process group; rank 0 writes all ranks' figures."""
    from datetime import timedelta

    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=timedelta(seconds=180))
    results = []
    for case in cases:
        model_name, plan_text = case.split(":", 1)
        mine = _state_case(model_name, plan_text)
        ranks: list = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        results.append({"model": model_name, "plan": plan_text, "world": dist.get_world_size(), "ranks": ranks})
        dist.barrier()
    if dist.get_rank() == 0:
        Path(out_path).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def measure_states(world: int, cases: list[tuple[str, str]], timeout: int = 900) -> list[dict]:
    """Run :func:`states_worker` on ``world`` gloo ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "states.json"
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               f"--log-dir={Path(tmp) / 'logs'}",  # not a torchelastic_* folder left in the temp dir
               str(Path(__file__).resolve()), "--states-worker", str(out), *(f"{m}:{p}" for m, p in cases)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        if proc.returncode != 0:
            raise RuntimeError(proc.stdout[-3000:] + proc.stderr[-6000:])
        return json.loads(out.read_text())


# ----------------------------------------------------------------------------- main
CONVENTIONS = {
    "flops": "torch.utils.flop_counter.FlopCounterMode (matmul-like ops only; 2mkn per GEMM). attention_core_full: "
             "SDPA with the MATH backend, bmm over the full s x s scores (is_causal ignored by the counter); the "
             "causal figure is full * (s+1)/(2s). layer_train: runtime's kernels, recompute applied, CPU flash "
             "kernel counted with torch's fused-SDPA formulas (backward = 5 bmm, 2.5x forward); gemm and "
             "attention_full apart. tp: the layer rebuilt with tp-local shapes. One layer; per micro-batch.",
    "activations": "bytes of distinct storages created during one layer's forward and alive after it (output "
                   "excluded; parameters and buffers never counted); runtime recompute applied; bf16 = model in "
                   "bf16. saved_hooks_bytes: saved_tensors_hooks, unique storages (recompute none).",
    "model_states": "bytes of distinct storages per rank: parameters at rest (local shards), parameters held "
                    "at the end of a forward (FSDP: sharded + unsharded), .grad when the optimizer steps, AdamW "
                    "exp_avg + exp_avg_sq (step scalars apart); one train_step, gloo.",
}


def record() -> dict:
    data = {"torch": torch.__version__, "command": "python bench/record_cost_oracles.py", "conventions": CONVENTIONS}
    data["flops"] = [measure_flops(*case) for case in FLOP_CASES]
    print(f"flops: {len(data['flops'])} cases", flush=True)
    data["activations"] = [measure_activations(*case) for case in ACT_CASES]
    print(f"activations: {len(data['activations'])} cases", flush=True)
    data["model_states"] = [r for world, cases in STATE_CASES.items() for r in measure_states(world, cases)]
    print(f"model states: {len(data['model_states'])} cases", flush=True)
    return data


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--states-worker":
        states_worker(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="measure and compare with the recording; write nothing")
    args = parser.parse_args()
    data = record()
    if args.check:
        old = json.loads(DATA.read_text())
        same = all(old[k] == data[k] for k in ("flops", "activations", "model_states"))
        print("recording is current" if same else "recording differs from a fresh measurement")
        sys.exit(0 if same else 1)
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {DATA.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
