"""FSDP2's copies on the compute stream (cost/step.py ``_zero3_exposed``, cost/frameworks.py
``fsdp2_stream_copies``): where ZeRO-3 is torch ``fully_shard``, the all-gather's copy-out (forward
and backward) and the reduce-scatter's copy-in run on the compute stream, so each micro-batch pays
``2 (2 S) + 2 G`` bytes of HBM traffic no overlap hides (S: the stage's gathered 16-bit weights, G:
its gradients in the reduce dtype).

Oracles outside the cost model: the parameter bytes are counted by torch on a module with the
spec's shapes, and the reduce-scatter copy-in is FSDP2's own ``foreach_reduce_scatter_copy_in``
run on gradients of those shapes (its input and output sizes are the bytes it reads and writes)."""
import dataclasses

import pytest
import torch
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    foreach_reduce_scatter_copy_in,
)

import partita.cost.step as step_mod
from partita.cost.frameworks import FRAMEWORKS
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.model import ModelSpec

SPEC = ModelSpec(name="tiny-llama", hidden=256, layers=2, heads=4, kv_heads=2, ffn_hidden=512, vocab=1024)


def _torch_model(spec: ModelSpec) -> nn.Module:
    """A Llama-shaped module with the spec's dimensions (q, k, v, o; gate, up, down; two RMSNorms
    per layer; untied embedding and output, final norm)."""
    h, d = spec.hidden, spec.hidden // spec.heads
    layers = []
    for _ in range(spec.layers):
        layers += [nn.Linear(h, spec.heads * d, bias=False), nn.Linear(h, spec.kv_heads * d, bias=False),
                   nn.Linear(h, spec.kv_heads * d, bias=False), nn.Linear(spec.heads * d, h, bias=False),
                   nn.Linear(h, spec.ffn_hidden, bias=False), nn.Linear(h, spec.ffn_hidden, bias=False),
                   nn.Linear(spec.ffn_hidden, h, bias=False), nn.RMSNorm(h), nn.RMSNorm(h)]
    return nn.ModuleList([nn.Embedding(spec.vocab, h), *layers, nn.RMSNorm(h), nn.Linear(h, spec.vocab, bias=False)])


def test_fsdp2_stream_copies_cost_the_real_copy_bytes(monkeypatch):
    params = list(_torch_model(SPEC).parameters())
    world = 2
    # FSDP2's own reduce-scatter copy-in on fp32 gradients of these shapes: it reads the
    # gradients and writes the flat reduce-scatter input
    grads = [torch.zeros(p.shape, dtype=torch.float32) for p in params]
    rs_input = torch.empty(sum(g.numel() for g in grads), dtype=torch.float32)
    foreach_reduce_scatter_copy_in(grads, rs_input, world)
    g_bytes = sum(g.numel() * g.element_size() for g in grads)
    copy_in = g_bytes + rs_input.numel() * rs_input.element_size()
    s_bytes = sum(p.numel() for p in params) * 2  # the gathered bf16 working weights
    copy_out = 2 * (2 * s_bytes)  # split_with_sizes_copy of the gathered buffer, forward and backward
    cluster = make_cluster("h100-sxm", devices=world)
    plan = Plan(dp=world, zero=3, mbs=1, gbs=4, seq_len=512, dtype="bf16", grad_dtype="fp32", framework="torchtitan")
    with_copies = step_mod.estimate_step_time(SPEC, cluster, plan).step
    monkeypatch.setitem(FRAMEWORKS, "torchtitan", dataclasses.replace(FRAMEWORKS["torchtitan"], fsdp2_stream_copies=False))
    without = step_mod.estimate_step_time(SPEC, cluster, plan).step
    dev = cluster.device
    per_micro_batch = (copy_out + copy_in) / (dev.hbm_tbps * 1e12 * dev.efficiency.memory_bandwidth)
    f = dev.efficiency.comm_overlap
    assert with_copies - without == pytest.approx(f * plan.grad_accum * per_micro_batch, rel=1e-6)


def test_frameworks_without_fsdp2_pay_no_stream_copies():
    """Megatron (and Composer, estimated as it: FSDP1's flat parameter is the all-gather buffer
    itself) and DeepSpeed keep no FSDP2 copies on the compute stream."""
    assert FRAMEWORKS["torchtitan"].fsdp2_stream_copies and FRAMEWORKS["partita"].fsdp2_stream_copies
    assert not any(FRAMEWORKS[n].fsdp2_stream_copies for n in ("megatron", "deepspeed", "mindspeed", "internevo"))
