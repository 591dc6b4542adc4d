"""MindFormers' cross-entropy priced op by op (cost/frameworks.py ``MINDFORMERS_CE_OPS``).

Oracle: the same chain of primitives - MindFormers' ``CrossEntropyLoss`` (``_LogSoftmax`` +
``_NLLLoss`` with their hand-written bprops, mindformers/core/loss/loss.py) on the fp32 cast of
the 16-bit logits (``LlamaForCausalLM.construct``) - replayed with torch ops of the same
dtypes, each op's logit-sized inputs and outputs counted by a ``TorchDispatchMode`` from the
tensors torch actually makes. Then the end-layer rule that turns the count into time, and one
published MindFormers row whose step the loss is a large share of.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from partita.cost import step
from partita.cost.compute import END_LAYER_PASSES, output_forward
from partita.cost.frameworks import FRAMEWORKS, MINDFORMERS_CE_BYTES, MINDFORMERS_CE_OPS
from partita.cost.shape import layer_shape
from partita.estimate import estimate
from partita.plan import Plan
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

ROOT = Path(__file__).resolve().parents[1]
N, V = 8, 1000  # rows (tokens) and vocabulary: per-row tensors (N x 1) are not logit-sized


class LogitBytes(TorchDispatchMode):
    """Per aten op: bytes of its inputs and outputs that hold one value per logit (N x V)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))

        def logit_bytes(tree) -> int:
            return sum(t.numel() * t.element_size() for t in tree_leaves(tree)
                       if isinstance(t, torch.Tensor) and t.numel() == N * V)
        read, written = logit_bytes((args, kwargs)), logit_bytes(out)
        if read or written:
            self.ops.append((str(func), read, written))
        return out


def _mindformers_chain(logits16: torch.Tensor, label: torch.Tensor, repeat_loss: int) -> tuple[LogitBytes, int]:
    """MindFormers' loss forward and its custom backward, op for op; returns the counter and the
    bytes of the OneHot output, which is made outside torch's count (MindSpore's ``OneHot`` writes
    the fp32 on/off values in one op; torch has no single op of that signature)."""
    one_hot = torch.zeros(N, V, dtype=torch.float32)
    one_hot[torch.arange(N), label] = 1.0
    dout = torch.ones(N)
    with LogitBytes() as count:
        logits = logits16.to(torch.float32)                      # LlamaForCausalLM: cast(logits, float32)
        logit_max = torch.amax(logits, dim=1, keepdim=True)      # _LogSoftmax: ReduceMax
        logit_sub = logits - logit_max                           # Sub
        logit_exp = torch.exp(logit_sub)                         # Exp
        exp_sum = torch.sum(logit_exp, dim=-1, keepdim=True)     # ReduceSum
        log_softmax = logit_sub - torch.log(exp_sum)             # Log (per row), Sub
        loss = torch.neg(log_softmax * one_hot).sum(-1)          # _NLLLoss: Mul, Neg, ReduceSum
        softmax = torch.exp(log_softmax)                         # _NLLLoss.bprop: Exp
        grad = (softmax - one_hot) * dout.unsqueeze(-1) * repeat_loss  # Sub, Mul (ExpandDims), Mul
        grad.to(logits16.dtype)                                  # the forward Cast's bprop
    assert loss.shape == (N,)
    return count, one_hot.numel() * one_hot.element_size()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_op_table_matches_torch_replay(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    count, one_hot_bytes = _mindformers_chain(torch.randn(N, V, dtype=dtype), torch.randint(0, V, (N,)), 2)
    measured = [(r / (N * V), w / (N * V)) for _, r, w in count.ops]
    table = [(r, w) for name, r, w in MINDFORMERS_CE_OPS if name != "OneHot"]
    assert measured == table, count.ops
    total = sum(r + w for _, r, w in count.ops) + one_hot_bytes
    assert total == MINDFORMERS_CE_BYTES * N * V == 108 * N * V


def test_end_rule_charges_the_whole_chain() -> None:
    """The output layer's compute (forward + 2x backward) for MindFormers exceeds Megatron's
    fused softmax by exactly (108 - 42) bytes per logit at the element-wise rate."""
    assert END_LAYER_PASSES == 1 + step.BACKWARD_PER_FORWARD
    model = load_model("llama-7b")
    device = make_cluster("ascend-910b2", 8).device
    plans = {fw: Plan(dp=4, tp=2, mbs=1, gbs=8, seq_len=4096, framework=fw) for fw in ("megatron", "mindformers")}
    times = {fw: END_LAYER_PASSES * output_forward(model, device, layer_shape(p)).time for fw, p in plans.items()}
    logits = 4096 * model.vocab / 2
    rate = device.hbm_tbps * 1e12 * device.efficiency.memory_bandwidth
    assert times["mindformers"] - times["megatron"] == pytest.approx(logits * (108 - 42) / rate, rel=1e-9)
    assert FRAMEWORKS["megatron"].ce_bytes_per_logit == 0.0


def test_published_row_whose_step_is_mostly_loss() -> None:
    """MindFormers' Qwen1.5-0.5B card (8 x 910B, dp 8, seq 8192, 151936-token vocabulary,
    21171 tokens/s/p): its loss is ~30 % of the step. Measured step 8 x 8192 / (21171 x 8)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from published_runs import load_cases
    cases, _ = load_cases(ROOT / "data" / "published_runs.csv")
    case = next(c for c in cases if c.source == "mindformers" and c.name == "Qwen1.5-0.5B" and c.metric == "step_time_s")
    assert case.measured == pytest.approx(8 * 8192 / (21171 * 8))
    with_loss = estimate(case.model, case.cluster, case.plan).step_time_s
    # MindSpeed differs from MindFormers only in the loss and in memory (cost/frameworks.py)
    fused = estimate(case.model, case.cluster, dataclasses.replace(case.plan, framework="mindspeed")).step_time_s
    assert abs(with_loss / case.measured - 1) < 0.10 < abs(fused / case.measured - 1)
