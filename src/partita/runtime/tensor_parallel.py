"""Tensor + sequence parallelism with DTensor ``parallelize_module`` (Megatron layout).

Column-parallel wq/wk/wv/w1/w3 and row-parallel wo/w2 [Shoeybi et al. 2019]; with
sequence parallel the norms and the residual stream are sharded on the sequence dim and
the row-parallel outputs reduce-scatter into it [Korthikanti et al. 2022]. The output
layer keeps its logits sharded on the vocab for ``loss_parallel``.
"""
from __future__ import annotations

from torch import nn

from ..models.registry import family_of
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               RowwiseParallel, SequenceParallel, parallelize_module)

from ..models.llama import MoE
from .lora import lora_tp_plan


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Shard ``model`` (a :class:`partita.models.Transformer` or a pipeline stage of one) over ``tp_mesh``."""
    if family_of(model).name == "hf":
        return apply_tp_hf(model, tp_mesh, sp)
    seq = Shard(1) if sp else Replicate()
    top: dict[str, object] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if getattr(model, "norm", None) is not None and sp:
        top["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, object] = {
            "attention": PrepareModuleInput(input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
        }
        plan.update(_moe_plan(seq, block.feed_forward) if isinstance(block.feed_forward, MoE) else {
            "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        })
        if sp:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, lora_tp_plan(block, plan, sp))


def _moe_plan(seq, moe: MoE) -> dict[str, object]:
    """A MoE layer under tp with expert tensor parallel 1 (Megatron-Core ``etp=1``): every
    tp rank runs the router and the routed experts it holds (whole, or its ep share) on
    the whole (sequence-gathered) input, as plain tensors; the identical outputs become a
    replicated DTensor, cut back to the sequence shard with SP (a local slice; its
    backward gathers the gradient). The shared experts are an ordinary tensor-parallel
    MLP, as Megatron-Core's ``SharedExpertMLP`` is (column- then row-parallel, its output
    all-reduced back to the plain replicated tensor the layer adds it to)."""
    plan: dict[str, object] = {"feed_forward": PrepareModuleInputOutput(
        input_layouts=(seq,), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(seq,), use_local_output=True)}
    if moe.shared is not None:
        plan.update({"feed_forward.shared.w1": ColwiseParallel(), "feed_forward.shared.w3": ColwiseParallel(),
                     "feed_forward.shared.w2": RowwiseParallel(output_layouts=Replicate())})
    return plan


def apply_tp_hf(model: nn.Module, tp_mesh: DeviceMesh, sp: bool = False) -> None:
    """Tensor parallel for HF Llama / Qwen2 / Mixtral: attention projections, dense MLPs,
    vocab-parallel head; Mixtral's fused expert weights stay replicated over tp. With
    sequence parallel (only on an :class:`~.hf_pipeline.HFStage`, which takes positions
    from the full input) the norms and the residual stream are sequence-sharded, attention
    (called with keyword arguments) and the MLP gather the sequence, and the row-parallel
    outputs reduce-scatter into it, as for the reference model."""
    seq = Shard(1) if sp else Replicate()
    top: dict[str, object] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False),
    }
    if sp:
        top["model.norm"] = SequenceParallel()
        model.seq_shards = tp_mesh.size()  # an HFStage: a later stage's input is a sequence shard
    parallelize_module(model, tp_mesh, top)
    for layer in model.model.layers.values() if isinstance(model.model.layers, nn.ModuleDict) else model.model.layers:
        plan: dict[str, object] = {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
        }
        if getattr(layer.self_attn, "q_norm", None) is not None:  # Qwen3: RMSNorm per head after q/k_proj
            # the heads (dim 2 of (b, s, heads, head_dim)) are tp-sharded; a replicated norm
            # weight whose gradient is summed over tp ranks (each sees only its heads)
            plan["self_attn.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
            plan["self_attn.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        if hasattr(layer.mlp, "gate_proj"):
            plan.update({"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
                         "mlp.down_proj": RowwiseParallel(output_layouts=seq)})
        if sp:
            plan.update({
                "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
                "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": seq},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
                "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(layer, tp_mesh, lora_tp_plan(layer, plan, sp))  # PEFT LoRA layers: runtime/lora.py
