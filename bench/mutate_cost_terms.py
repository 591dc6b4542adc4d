"""Break one cost term at a time and check that the planning tests notice.

    python bench/mutate_cost_terms.py                 # the named single-term breaks
    python bench/mutate_cost_terms.py --auto 60       # plus 60 automatic operator/constant mutants
    python bench/mutate_cost_terms.py --only "bubble x2" --tests tests/test_cost_formulas.py
    python bench/mutate_cost_terms.py --working-tree  # uncommitted edits instead of HEAD

Issue 12 asks that breaking any single term of ``src/partita/cost/`` (a constant, an
operator, a max/min, a returned value) fails the planning tests - the ones that run
without torch - in at least 90 % of cases. Each mutant is applied to a private copy of
``src/``, ``tests/``, ``bench/`` and ``data/`` taken from the last commit (``git archive
HEAD``), so other people's half-done edits in the working tree never count a mutant as
caught (``--working-tree`` copies the working tree instead); the working tree is never
touched. The planning
tests run there with ``-x`` (fastest first, so a caught mutant costs seconds), and the
mutant counts as caught when pytest fails. Printed: each mutant's verdict, the catch
rate, and the survivors by name.

Two sets:

* **named** (:data:`MUTANTS`): hand-written breaks of every term the cost model has -
  FLOPs per layer kind, recompute, each collective, pipeline schedules, every memory part
  - each a textual replacement that must match the source exactly once. A replacement
  that no longer matches (the source moved on) is reported as *stale*, not counted.
* **automatic** (``--auto N``): ``N`` mutants drawn (by a hash of ``--seed`` and each
  site's file, line text and kind, so edits elsewhere do not redraw the sample) from every numeric
  constant (``0 -> 1``, ``1 -> 2``, else ``c -> 2c``), arithmetic operator (``+ <-> -``, ``* <-> /``) and
  ``min``/``max`` call in ``src/partita/cost/*.py`` - the kinds the issue names - made
  with :mod:`ast` and written back with :func:`ast.unparse`.

Equivalent mutants - breaks that cannot change any result (``x * 1 -> x / 1``, a ``max``
whose other argument can never win) - are listed in :data:`EQUIVALENT` (named) and
:data:`EQUIVALENT_AUTO` (automatic, keyed by file, source line and change), each with the
reason it cannot change a result. They are printed as *equivalent*, not run, and left out
of the catch rate (neither caught nor survived).

Torch is never imported: the tests run are :data:`PLANNING_TESTS`.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COST = Path("src/partita/cost")
#: The tests that run without torch, fastest and most sensitive first (``-x`` stops at
#: the first failure, so the order only changes how long a caught mutant takes).
PLANNING_TESTS = ("tests/test_cost_formulas.py", "tests/test_cost_terms_pinned.py", "tests/test_cost_terms_survivors.py",
                  "tests/test_cost_oracles.py",
                  "tests/test_calibrate_comm.py", "tests/test_calibrate_overheads.py", "tests/test_etp.py",
                  "tests/test_frameworks.py", "tests/test_golden_estimates.py", "tests/test_model_specs.py",
                  "tests/test_compression.py", "tests/test_published_accuracy.py", "tests/test_estimate_cli.py",
                  "tests/test_search.py", "tests/test_search_published.py")
#: Tests left out: they time the CLI's start-up, so on a loaded machine they fail without
#: any mutant, which would count a mutant as caught for the wrong reason.
DESELECT = ("tests/test_estimate_cli.py::test_estimate_does_not_import_torch_and_is_fast",
            # the runtime's refusal: imports torch, so it is no planning test
            "tests/test_etp.py::test_runtime_refuses_etp_with_what_is_missing")
#: Put first on the tests' ``PYTHONPATH``: makes ``import torch`` fail, so a planning test
#: that needs torch fails the unmutated run instead of catching mutants with torch's help.
NO_TORCH = "import sys\nsys.modules['torch'] = None  # planning tests run without torch\n"
#: More tests to leave out: ``--deselect``, and the tests that already fail on the unmutated
#: tree (another change broke them; printed by :func:`prepare`, never counted as catches).
EXTRA_DESELECT: list[str] = []
#: Seconds one test run may take before the mutant counts as caught (a hang is a failure).
RUN_TIMEOUT_S = 900

#: (name, file under src/partita/cost/, exact source text, replacement).
MUTANTS: list[tuple[str, str, str, str]] = [
    ("attention FLOPs x2", "compute.py", "attn_flops = 2 * tokens * s_ctx", "attn_flops = 4 * tokens * s_ctx"),
    ("causal context (no /2)", "compute.py", "s_ctx = (shape.seq_len + 1) / 2", "s_ctx = (shape.seq_len + 1)"),
    ("attention projections 0", "compute.py", "attn_proj_flops = 2 * tokens * proj_weights", "attn_proj_flops = 0 * tokens * proj_weights"),
    ("MLP FLOPs x2", "compute.py", "mlp = 2 * tokens * mats", "mlp = 4 * tokens * mats"),
    ("router FLOPs 0", "compute.py", "router = 2 * tokens * h * mo.num_experts / tp", "router = 0.0"),
    ("routed expert FLOPs x2", "compute.py", "routed = 2 * routed_tokens", "routed = 4 * routed_tokens"),
    ("output layer FLOPs x2", "compute.py", "flops = 2 * tokens * model.hidden * model.vocab / shape.tp", "flops = 4 * tokens * model.hidden * model.vocab / shape.tp"),
    ("cross-entropy bytes 0", "compute.py", "ce_bytes = tokens * model.vocab", "ce_bytes = 0 * tokens * model.vocab"),
    ("embedding bytes x2", "compute.py", "nbytes = 2 * shape.tokens", "nbytes = 4 * shape.tokens"),
    ("element-wise x2", "compute.py", "cost.elementwise_time += elem_bytes /", "cost.elementwise_time += 2 * elem_bytes /"),
    ("kernel overhead 0", "compute.py", "cost.overhead_time += device.efficiency.kernel_overhead_us_per_layer * 1e-6", "cost.overhead_time += 0.0"),
    ("GEMM size curve off", "compute.py", "eff *= size_gflop / (size_gflop + device.efficiency.gemm_half_gflop)", "eff *= 1.0"),
    ("selective share x2", "compute.py", "return recomputed / (sum(gemms) + halves)", "return 2 * recomputed / (sum(gemms) + halves)"),
    ("layer compute without its forward", "step.py", "return StageTerms(compute=t + bwd, recompute=rc", "return StageTerms(compute=bwd, recompute=rc"),
    ("flash attention backward 2x (no score recompute)", "step.py", "FLASH_BACKWARD_PER_FORWARD = 2.5", "FLASH_BACKWARD_PER_FORWARD = 2"),
    ("full recompute 0", "step.py", "rc, rc_flops = layer.time - skipped[1], layer.flops - skipped[0]", "rc, rc_flops = 0.0, layer.flops - skipped[0]"),
    ("tp collectives x2", "step.py", "tp_comm=n_tp * tp_coll + tp_framework", "tp_comm=2 * n_tp * tp_coll + tp_framework"),
    ("tp host work 0", "step.py", "tp_framework = dev.efficiency.tp_framework_us_per_layer * 1e-6", "tp_framework = 0 * 1e-6"),
    ("recompute host share x2", "step.py", "(1 + rc_full * FORWARD_SHARE)", "(1 + 2 * rc_full * FORWARD_SHARE)"),
    ("tp overlap ignored", "step.py", "tp_coll *= 1 - dev.efficiency.tp_overlap", "tp_coll *= 1"),
    ("cp exchange x2", "step.py", "cp_pass = (1 + BACKWARD_PER_FORWARD + rc_full)", "cp_pass = 2 * (1 + BACKWARD_PER_FORWARD + rc_full)"),
    ("cp hidden by attention ignored", "step.py", "(layer.cp - 1) * hop - attn)", "(layer.cp - 1) * hop)"),
    ("ep all-to-all 0", "step.py", "a2a = 2 * (2 + rc_full) * comm.all_to_all", "a2a = 0 * (2 + rc_full) * comm.all_to_all"),
    ("pp send/recv x2", "step.py", "pp_send_recv=2 * comm.send_recv", "pp_send_recv=4 * comm.send_recv"),
    ("output layer tp collectives 1", "step.py", "output=_end_terms(output_forward(model, dev, layer), tp_coll, 2)", "output=_end_terms(output_forward(model, dev, layer), tp_coll, 1)"),
    ("embedding compute 0", "step.py", "embedding=_end_terms(embedding_forward(model, dev, layer), tp_coll, 1)", "embedding=_end_terms(embedding_forward(model, dev, layer).scaled(0), tp_coll, 1)"),
    ("zero3 first-layer exposure 0", "step.py", "+ t / max(shape.n_layers, 1) + framework", "+ framework"),
    ("zero3 host work 0", "step.py", "framework = shape.n_layers * cluster.device.efficiency.zero3_framework_us_per_layer * 1e-6", "framework = 0.0"),
    ("zero3 gather once", "step.py", "t = 2 * comm.all_gather(dev, dense * w, g, k)", "t = comm.all_gather(dev, dense * w, g, k)"),
    ("Adam bytes x2", "step.py", "opt_bytes = ADAM_STEP_BYTES_PER_PARAM * (", "opt_bytes = 2 * ADAM_STEP_BYTES_PER_PARAM * ("),
    ("dp grad reduce 0", "step.py", "exp_rs = max(t_rs / n_layers, t_rs - bwd_window) if plan.overlap_grad_reduce else t_rs", "exp_rs = 0.0"),
    ("dp param gather 0", "step.py", "exp_ag = max(t_ag / n_layers, t_ag - fwd_window) if _param_gather_overlaps(plan) else t_ag", "exp_ag = 0.0"),
    ("tied embedding sync 0", "step.py", "parts[\"tied embedding sync\"] = comm.all_reduce(dev, size,", "parts[\"tied embedding sync\"] = 0 * comm.all_reduce(dev, size,"),
    ("tied embedding always 2 nodes", "step.py", 'parts["tied embedding sync"] = comm.all_reduce(dev, size, *((2, 1) if same_node else (1, 2)))', 'parts["tied embedding sync"] = comm.all_reduce(dev, size, 1, 2)'),
    ("bubble x2", "pipeline.py", "bubble = (total - slowest) / v", "bubble = 2 * (total - slowest) / v"),
    ("zero-bubble /1", "pipeline.py", "        bubble /= 3", "        bubble /= 1"),
    ("in-flight +1", "pipeline.py", "        return min(m, p - rank)", "        return min(m, p - rank) + 1"),
    ("weights x2", "states.py", "weights = params * weight_b /", "weights = 2 * params * weight_b /"),
    ("fp8 weight copy 0", "states.py", "weights += params * 1 /", "weights += params * 0 /"),
    ("gradients x2", "states.py", "grads = params * grad_b /", "grads = 2 * params * grad_b /"),
    ("optimizer 0", "states.py", "optimizer = params * opt_b /", "optimizer = 0 * params * opt_b /"),
    ("experts not divided by ep", "states.py", "expert = rank.n_moe * routed / (split.ep * split.etp)", "expert = rank.n_moe * routed / split.etp"),
    ("activations x2", "activations.py", "full = tokens * (outside / out_div + inside)", "full = 2 * tokens * (outside / out_div + inside)"),
    ("full-recompute activations x2", "activations.py", "return tokens * e * h / out_div  # only the layer input", "return 2 * tokens * e * h / out_div"),
    ("selective activations x2", "activations.py", "return tokens * (e * 2 * h / out_div + kept_inside)", "return 2 * tokens * (e * 2 * h / out_div + kept_inside)"),
    ("embedding output activation 0", "activations.py", "per_chunk += tokens * BYTES[plan.dtype]", "per_chunk += 0 * tokens * BYTES[plan.dtype]"),
    ("transient 0", "activations.py", "return 2 * activation_bytes(model, shape, \"none\", moe)", "return 0.0"),
    ("logits transient x2", "memory.py", "return tokens * model.vocab / plan.tp * (BYTES[plan.dtype] + 4)", "return 2 * tokens * model.vocab / plan.tp * (BYTES[plan.dtype] + 4)"),
    ("zero3 gathered x2", "transient.py", "return unit * (w + g) + layer * w", "return 2 * unit * (w + g) + layer * w"),
    ("zero3 prefetched unit 0", "transient.py", "return unit * (w + g) + layer * w", "return unit * (w + g)"),
    ("zero3 output-layer unit ignored", "transient.py", "out = _split_tp(out, _end_replicated(model, False), split.tp)", "out = 0.0"),
    ("zero3 loss phase drops the gathered output weight", "transient.py", "loss_phase = t_logits + 2 * w * out + w * layer", "loss_phase = t_logits + w * layer"),
    ("zero3 after-output phase drops the reduce-scatter input", "transient.py", "after_output = t_layer + g * out + 2 * w * layer", "after_output = t_layer + 2 * w * layer"),
    ("zero3 last rank adds the transient back", "transient.py", "return max(loss_phase, after_output, other_units) - max(t_layer, t_logits)", "return max(loss_phase, after_output, other_units)"),
    ("zero3 experts of a unit not divided by ep", "transient.py", "+ routed / (split.ep * split.etp))", "+ routed / split.etp)"),
    ("buffers x2", "memory.py", "return groups * device.comm_buffer_mib_per_group * 2 ** 20", "return 2 * groups * device.comm_buffer_mib_per_group * 2 ** 20"),
    ("fragmentation x2 (peak)", "memory.py", "return allocated + allocated * device.allocator_fragmentation + device.runtime_reserved_gib * GIB", "return allocated + 2 * allocated * device.allocator_fragmentation + device.runtime_reserved_gib * GIB"),
    ("runtime reservation 0 (breakdown)", "memory.py", "out[\"runtime (context, workspaces)\"] = device.runtime_reserved_gib * GIB", "out[\"runtime (context, workspaces)\"] = 0.0"),
    ("memory total drops transient", "memory.py", "return (self.weights + self.gradients + self.optimizer + self.activations + self.transient", "return (self.weights + self.gradients + self.optimizer + self.activations"),
    # communication formulas (cost/comm.py)
    ("all-reduce intra factor 2 -> 1", "comm.py", "t = 2 * (g - 1) / g * size / intra_bandwidth(device, g) if g > 1 else 0.0", "t = 1 * (g - 1) / g * size / intra_bandwidth(device, g) if g > 1 else 0.0"),
    ("all-reduce inter-node term 0", "comm.py", "t += 2 * (k - 1) / k * (size / g) / inter_bandwidth(device)", "t += 0.0"),
    ("all-gather inter-node not divided by g", "comm.py", "t += (k - 1) / k * (size / g) / inter_bandwidth(device)", "t += (k - 1) / k * size / inter_bandwidth(device)"),
    ("latency inter steps 0", "comm.py", "inter = steps_factor * math.ceil(math.log2(k)) * device.inter_latency_us if k > 1 else 0.0", "inter = 0.0"),
    ("full-mesh bandwidth ignores peer count", "comm.py", "return min(device.peer_gbps * max(g - 1, 1), device.intra_gbps) * 1e9 * eff", "return device.peer_gbps * 1e9 * eff"),
    ("all-to-all max -> min", "comm.py", "return max(t_intra, t_inter) + lat", "return min(t_intra, t_inter) + lat"),
    ("send/recv inter-node at intra bandwidth", "comm.py", "return size / inter_bandwidth(device) + device.inter_latency_us * 1e-6", "return size / intra_bandwidth(device, 8) + device.inter_latency_us * 1e-6"),
    # pipeline schedules (cost/pipeline.py)
    ("gpipe holds one micro-batch", "pipeline.py", "        return m * v", "        return v"),
    ("interleaved warm-up without (v - 1) p", "pipeline.py", "return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)", "return min(m * v, 2 * (p - rank - 1) + 1)"),
    ("interleaving does not shrink the bubble", "pipeline.py", "bubble = (total - slowest) / v", "bubble = (total - slowest)"),
    # more compute terms
    ("MoE permutation traffic 0", "compute.py", "permute_bytes = 4 * e * tokens * mo.top_k * h / tp", "permute_bytes = 0.0"),
    ("shared-expert FLOPs 0", "compute.py", "shared = 2 * tokens * mats * h * mo.shared_ffn_hidden * mo.shared_experts / tp", "shared = 0.0"),
    ("expert GEMM count ignores ep", "compute.py", "local_experts = mo.num_experts / shape.ep", "local_experts = mo.num_experts"),
    ("fp8 attention at fp8 peak", "compute.py", "attn_dtype = \"bf16\" if dtype == \"fp8\" else dtype", "attn_dtype = dtype"),
    ("RoPE traffic 0", "compute.py", "rope = 2 * (model.q_dim + model.kv_dim) / tp if model.position == \"rope\" else 0.0", "rope = 0.0"),
    ("norm traffic always sharded", "compute.py", "outside_div = tp if shape.sp else 1", "outside_div = tp"),
    # more step terms
    ("MoE layer tp collectives as dense", "step.py", "tp_framework, cp_pass, a2a, skip_moe) if moe else _ZERO", "tp_framework, cp_pass, 2 * a2a, skip_moe) if moe else _ZERO"),
    ("zero-0 all-reduce as reduce-scatter", "step.py", "t_rs = comm.all_reduce(dev, f * dense * _grad_bytes(plan), g, k)", "t_rs = comm.reduce_scatter(dev, f * dense * _grad_bytes(plan), g, k)"),
    ("optimizer not sharded by zero", "step.py", "shard_dense = dense / state_shard(plan) if plan.zero >= 1 else dense", "shard_dense = dense"),
    ("cp exchange K/V width halved", "step.py", "kv_width = (model.q_dim + model.attn_out_dim) if model.mla else 2 * model.kv_dim", "kv_width = (model.q_dim + model.attn_out_dim) if model.mla else model.kv_dim"),
    ("pp send ignores sequence parallel", "step.py", "size = tokens * model.hidden * e / (layer.tp if layer.sp else 1)", "size = tokens * model.hidden * e"),
    # more memory terms
    ("gradients sharded from zero 1", "states.py", "grads = params * grad_b / (shard if z >= 2 and not full_grads else 1)", "grads = params * grad_b / (shard if z >= 1 and not full_grads else 1)"),
    # gradient accumulation modes (plan.grad_accum_mode)
    ("unsharded accumulation still sharded", "states.py", "return plan.grad_accum_mode == \"unsharded\" and plan.grad_accum > 1", "return False"),
    ("zero-2 per-micro-batch reduce-scatters free", "step.py", "exp_rs += (plan.grad_accum - 1) * max(0.0, t_rs - bwd_window - fwd_window)", "exp_rs += 0.0"),
    ("zero-3 unsharded still reduces per micro-batch", "step.py", "gb = grad_bytes(shape.dtype, shape.grad_dtype) if reduce else 0", "gb = grad_bytes(shape.dtype, shape.grad_dtype)"),
    ("flash attention backward extra 0", "step.py", "bwd = BACKWARD_PER_FORWARD * t + (FLASH_BACKWARD_PER_FORWARD - BACKWARD_PER_FORWARD) * layer.attn_time", "bwd = BACKWARD_PER_FORWARD * t"),
    ("expert shard = dense shard", "states.py", "return max(1, state_shard(plan) * plan.tp // (plan.ep * plan.etp))", "return state_shard(plan)"),
    ("HSDP: states sharded over all of dp", "states.py", "shard = plan.dp_shard if 0 < plan.dp_shard < plan.dp else plan.dp", "shard = plan.dp"),
    ("HSDP: no all-reduce across replicas", "step.py", "t += comm.all_reduce(dev, size / (g * k), rg, rk)", "t += 0.0"),
    ("HSDP: replica all-reduce of the whole gradient", "step.py", "t += comm.all_reduce(dev, size / (g * k), rg, rk)", "t += comm.all_reduce(dev, size, rg, rk)"),
    ("HSDP: gathers over all of dp", "shape.py", "return _span_of(plan.tp, _hsdp_shard(plan) * plan.cp, devices_per_node)", "return _span_of(plan.tp, plan.dp * plan.cp, devices_per_node)"),
    ("tp splits the norms", "states.py", "return (total - replicated) / tp + replicated", "return total / tp"),
    ("tp splits the router", "states.py", "params += h * model.moe.num_experts + (h if model.moe.shared_expert_gate else 0)", "params += 0"),
    ("zero 2 fp32 without the fp32 shard", "states.py", "weights += params * 4 / shard", "weights += 0.0"),
    ("activations inside tp not divided", "activations.py", "inside = e * (model.q_dim + 2 * model.kv_dim + model.attn_out_dim) / tp", "inside = e * (model.q_dim + 2 * model.kv_dim + model.attn_out_dim)"),
    ("log-sum-exp 0", "activations.py", "inside += FP32_BYTES * model.heads / tp  # fp32 log-sum-exp per head (flash attention)", "inside += 0.0"),
    ("router probabilities 0", "activations.py", "inside += routed + shared + FP32_BYTES * mo.num_experts / tp", "inside += routed + shared"),
    ("tied copy on last stage 0", "states.py", "out += model.vocab * model.hidden  # the last stage keeps its own copy of the tied weight", "out += 0"),
    # frameworks (cost/frameworks.py): each documented difference broken alone
    ("eager activations ignored", "activations.py", "        full += eager_extra_bytes(model, shape, moe)", "        full += 0.0"),
    ("eager norms fp32 copy 0", "activations.py", "per_token = 2 * ((8 - e) * model.hidden + 4) / out_div", "per_token = 2 * (4) / out_div"),
    ("eager GQA expansion 0", "activations.py", "+ 2 * (model.q_dim - model.kv_dim) * e / tp\n", "+ 0.0\n"),
    ("eager SiLU output 0", "activations.py", "per_token += model.ffn_hidden * e / tp", "per_token += 0.0"),
    ("eager MoE routing per-layer 0", "activations.py", "per_layer = FP32_BYTES * mo.num_experts", "per_layer = 0.0"),
    ("early stop ignored", "step.py", "early = rc_full and FRAMEWORKS[layer.framework].checkpoint_early_stop", "early = False"),
    ("early stop skips nothing", "step.py", "rc, rc_flops = layer.time - skipped[1], layer.flops - skipped[0]", "rc, rc_flops = layer.time, layer.flops"),
    ("last GEMM = whole MLP", "compute.py", "return dense_mlp / mats, gemm_time(device, dense_mlp, shape.dtype, mats) / mats", "return dense_mlp, gemm_time(device, dense_mlp, shape.dtype, mats)"),
    ("early stop keeps the tp collective", "step.py", "n_dense_tp = 2 * (2 + rc_full) - ((0.5 if layer.sp else 1.0) if early else 0.0)", "n_dense_tp = 2 * (2 + rc_full)"),
    ("autocast ignored", "memory.py", "autocast = zero == 0 and FRAMEWORKS[plan.framework].zero0_autocast", "autocast = False"),
    ("autocast optimizer 12", "states.py", "return params * 4, params * 4, params * 8", "return params * 4, params * 4, params * 12"),
    ("param gather always overlapped", "step.py", "return plan.overlap_param_gather and FRAMEWORKS[plan.framework].param_gather_overlap", "return plan.overlap_param_gather"),
    ("tp overlap regardless of framework", "shape.py", "overlap = plan.tp_comm_overlap and FRAMEWORKS[plan.framework].tp_comm_overlap", "overlap = plan.tp_comm_overlap"),
    ("fp8 casts 0", "compute.py", "elem_bytes += FRAMEWORKS[shape.framework].fp8_cast_bytes * fp8_cast_elements(model, shape, moe)", "elem_bytes += 0.0"),
    ("fp8 cast weights 0", "compute.py", "    return shape.tokens * per_token + weights\n", "    return shape.tokens * per_token\n"),
]


#: Named mutants that cannot change any result: name -> why. Not run, not counted.
EQUIVALENT: dict[str, str] = {}

#: Automatic mutants that cannot change any result: (file, enclosing function or class,
#: stripped source line of the site, n-th site on that line (0-based, walk order; printed as ``file:line.n``), change
#: as printed) -> why. Keyed by the line's text, not its number, so an entry survives
#: edits elsewhere in the file; an entry whose line is gone simply stops matching.
EQUIVALENT_AUTO: dict[tuple[str, str, str, int, str], str] = {
    ("step.py", "_layer_terms", "cp_pass: float, a2a: float, skipped: tuple[float, float] = (0.0, 0.0)) -> StageTerms:",
     0, "0.0 -> 1.0"): "a default argument no caller uses: both calls of _layer_terms pass skipped",
    ("step.py", "StageTime", "flops: float = 0.0  # hardware FLOPs per micro-batch, incl. recompute", 0, "0.0 -> 1.0"):
        "a dataclass default no constructor uses: every StageTime(...) in src/ passes flops",
    **{("step.py", "StageTime", f"{name}: float = 0.0", 0, "0.0 -> 1.0"):
       f"a dataclass default no constructor uses: all three StageTime(...) in src/ (step.py twice, traced.py) pass {name}"
       for name in ("forward", "backward")},
    ("shape.py", "collective_spans", "etp: int = 1) -> CollectiveSpans:", 0, "1 -> 2"):
        "a default argument no caller uses: collective_spans is always called with plan.etp",
    ("shape.py", "collective_spans", 'group_span(plan, "etp", devices_per_node) if etp > 1 else (1, 1))', 1, "1 -> 2"):
        "the etp span of an etp-1 plan: step.py reads spans.etp only under layer.etp > 1",
    ("memory.py", "dp_gradient_bytes", 'best = {"held": held, "wire": wire, "ratio": wire / held if held else 1.0,', 1,
     "1.0 -> 2.0"): "unreachable: the branch runs only when held > best['held'] >= 0, so held is never 0 there",
    ("memory.py", "peak_memory_ladder",
     "out: dict[tuple[str, int], tuple[float, int]] = {step: (-1.0, 0) for step in steps}", 1, "0 -> 1"):
        "the placeholder rank is always overwritten: every rank's total (>= 0) exceeds the -1.0 it starts from",
    ("compute.py", "last_gemm", "mats = 3 if model.gated else 2", 0, "3 -> 6"):
        "mats cancels: last_gemm returns mlp / mats and gemm_time(mlp, mats) / mats, both mats-free",
    ("compute.py", "last_gemm", "mats = 3 if model.gated else 2", 1, "2 -> 4"):
        "mats cancels: last_gemm returns mlp / mats and gemm_time(mlp, mats) / mats, both mats-free",
    ("compression.py", "powersgd_seconds", "if count.gemm_flops <= 0:", 0, "0 -> 1"):
        "gemm_flops is 0 or at least 6 (4 n m r + 2 n r^2 with n, m, r >= 1 per compressed matrix)",
    ("compute.py", "_layer_forward", "cost.gemm_time += gemm_time(device, routed, dtype, max(1, int(local_experts * mats)))",
     1, "1 -> 2"): "the other argument is always >= 2: validate() makes ep divide num_experts (local_experts >= 1) "
                   "and mats is 2 or 3, so max(2, x) == max(1, x)",
    **{("shape.py", "Zero3Shape", "replica_span: tuple[int, int] = (1, 1)  # HSDP: the groups holding the same shard",
        nth, "1 -> 2"): "a NamedTuple default no constructor uses: zero3_shape(), the only Zero3Shape(...) in src/, "
                        "passes replica_span" for nth in (0, 1)},
}


@dataclass
class Mutant:
    name: str
    path: Path  # relative to the repository root
    source: str  # the whole mutated file
    equivalent: str = ""  # why it cannot change a result ("" when it can)


def named_mutants(root: Path, only: list[str]) -> tuple[list[Mutant], list[str]]:
    """The applicable named mutants of the tree at ``root`` and the names of the stale ones."""
    out, stale = [], []
    for name, rel, old, new in MUTANTS:
        if only and name not in only:
            continue
        path = COST / rel
        text = (root / path).read_text()
        if text.count(old) != 1:
            stale.append(name)
            continue
        out.append(Mutant(name, path, text.replace(old, new), EQUIVALENT.get(name, "")))
    return out, stale


class _Sites(ast.NodeVisitor):
    """Every mutable site of a module: numeric constants, arithmetic operators, min/max."""

    def __init__(self) -> None:
        self.sites: list[tuple[str, int, int]] = []  # (kind, line, index among nodes of the walk)
        self.index = 0
        self.skip: set[int] = set()  # ids of nodes that are no cost term (see _skip)

    def kind(self, node: ast.AST) -> str:
        return "" if id(node) in self.skip else _site_kind(node)

    def _skip(self, nodes: list[ast.AST]) -> None:
        """Decorator arguments (``lru_cache(maxsize=...)``) and f-string contents (error
        messages) are walked, so the indices stay the same, but are not sites: breaking
        them changes no estimate."""
        self.skip.update(id(sub) for node in nodes for sub in ast.walk(node))

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._skip(list(node.decorator_list))
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self._skip([node])
        self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        kind = self.kind(node)
        if kind:
            self.sites.append((kind, getattr(node, "lineno", 0), self.index))
        self.index += 1
        super().generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:  # skip docstrings and bare expressions
        if not isinstance(node.value, ast.Constant):
            self.generic_visit(node)
        else:
            self.index += sum(1 for _ in ast.walk(node))

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)


def _site_kind(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return "constant"
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        return "operator"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
        return "min/max"
    return ""


_SWAP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}


def _mutate_node(node: ast.AST) -> str:
    """Mutate ``node`` in place; returns a description."""
    if isinstance(node, ast.Constant):
        old = node.value
        node.value = old + 1 if old in (0, 1) else old * 2
        return f"{old!r} -> {node.value!r}"
    if isinstance(node, ast.BinOp):
        old = type(node.op)
        node.op = _SWAP[old]()
        return f"{old.__name__} -> {type(node.op).__name__}"
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    old_name = node.func.id
    node.func.id = "max" if old_name == "min" else "min"
    return f"{old_name} -> {node.func.id}"


class _Walker(_Sites):
    """Walks like :class:`_Sites` and mutates the node with a given walk index."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.done = ""

    def generic_visit(self, node: ast.AST) -> None:
        if self.index == self.target and self.kind(node):
            self.done = _mutate_node(node)
        super().generic_visit(node)


def _site_key(root: Path, seed: int, site: tuple[Path, str, int, int]) -> str:
    """The sort key that draws the sample: a hash of the seed, the file, the site's kind,
    its line's text and its walk index counted from the first site on that line. Edits
    elsewhere in the file (lines added or removed) leave it unchanged, so the sample
    stays the same mutants while other people change other terms."""
    rel, kind, line, index = site
    lines = _lines(root / rel)
    text = lines[line - 1].strip() if line else ""
    first = _first_index_on_line(root / rel, line)
    return hashlib.sha256(f"{seed}|{rel.name}|{kind}|{text}|{index - first}".encode()).hexdigest()


@lru_cache(maxsize=None)
def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@lru_cache(maxsize=None)
def _all_sites(path: Path) -> tuple[tuple[str, int, int], ...]:
    walker = _Sites()
    walker.visit(ast.parse(path.read_text()))
    return tuple(walker.sites)


@lru_cache(maxsize=None)
def _function_at(path: Path, line: int) -> str:
    """Name of the innermost function (or class) holding ``line``; "" at module level."""
    name, span = "", None
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.lineno <= line <= (node.end_lineno or 0):
            if span is None or node.end_lineno - node.lineno < span:  # type: ignore[operator]
                name, span = node.name, node.end_lineno - node.lineno  # type: ignore[operator]
    return name


def _first_index_on_line(path: Path, line: int) -> int:
    return min(index for _, ln, index in _all_sites(path) if ln == line)


def auto_mutants(root: Path, count: int, seed: int) -> list[Mutant]:
    """``count`` automatic mutants drawn from every site of every cost module under ``root``."""
    sites = []
    for path in sorted((root / COST).glob("*.py")):
        walker = _Sites()
        walker.visit(ast.parse(path.read_text()))
        sites += [(path.relative_to(root), kind, line, index) for kind, line, index in walker.sites]
    chosen = sorted(sites, key=lambda site: _site_key(root, seed, site))[:count]
    out = []
    for rel, kind, line, index in sorted(chosen, key=lambda s: (str(s[0]), s[2], s[3])):
        text = (root / rel).read_text()
        tree = ast.parse(text)
        walker = _Walker(index)
        walker.visit(tree)
        line_text = text.splitlines()[line - 1].strip() if line else ""
        nth = sum(1 for _, ln, i in _all_sites(root / rel) if ln == line and i < index)  # sites before it on its line
        why = EQUIVALENT_AUTO.get((rel.name, _function_at(root / rel, line), line_text, nth, walker.done), "")
        out.append(Mutant(f"{rel.name}:{line}.{nth} {kind} {walker.done}  [{line_text}]", rel, ast.unparse(tree) + "\n", why))
    return out


def _pytest(tests: list[str]) -> list[str]:
    deselect = [arg for test in DESELECT + tuple(EXTRA_DESELECT) for arg in ("--deselect", test)]
    return [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *deselect, *tests]


def _env(work: Path) -> dict[str, str]:
    """The tests' environment: the copy's ``src`` and a ``sitecustomize`` that blocks torch."""
    block = work / "_no_torch"
    if not (block / "sitecustomize.py").exists():
        block.mkdir(exist_ok=True)
        (block / "sitecustomize.py").write_text(NO_TORCH)
    return dict(os.environ, PYTHONPATH=f"{block}{os.pathsep}{work / 'src'}", PYTHONHASHSEED="0")


def run_tests(work: Path, tests: list[str]) -> tuple[bool, float]:
    """(caught, seconds): whether the planning tests fail in the mutated copy ``work``."""
    env = _env(work)
    t0 = time.time()
    try:
        r = subprocess.run(_pytest(tests), cwd=work, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        caught = r.returncode != 0
    except subprocess.TimeoutExpired:
        caught = True
    return caught, time.time() - t0


def _copy_tree(work: Path) -> None:
    for part in ("src", "tests", "bench", "data"):  # data/: the 470-row table a planning test reads
        shutil.copytree(ROOT / part, work / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")


def check(work: Path, mutants: list[Mutant], tests: list[str], label: str) -> list[str]:
    """Run every mutant in the copy ``work``; print verdicts and the catch rate; return the survivors."""
    survivors: list[str] = []
    equivalent = [m for m in mutants if m.equivalent]
    for m in equivalent:
        print(f"  equivalent        {m.name}: {m.equivalent}", flush=True)
    mutants = [m for m in mutants if not m.equivalent]
    for m in mutants:
        target = work / m.path
        original = target.read_text()
        target.write_text(m.source)
        shutil.rmtree(target.parent / "__pycache__", ignore_errors=True)
        try:
            caught, secs = run_tests(work, tests)
        finally:
            target.write_text(original)
            shutil.rmtree(target.parent / "__pycache__", ignore_errors=True)
        print(f"  {'caught  ' if caught else 'SURVIVED'} {secs:6.1f}s  {m.name}", flush=True)
        if not caught:
            survivors.append(m.name)
    n = len(mutants)
    if n:
        print(f"{label}: {n - len(survivors)}/{n} caught ({(n - len(survivors)) / n:.1%}); "
              f"{len(equivalent)} equivalent left out")
    for name in survivors:
        print(f"  survivor: {name}")
    return survivors


def copy_tree(work: Path, working_tree: bool) -> None:
    """Copy the tree under test into ``work``: ``HEAD`` (default) or the working tree."""
    if working_tree:
        _copy_tree(work)
        return
    archive = subprocess.run(["git", "archive", "HEAD", "src", "tests", "bench", "data", "pyproject.toml"], cwd=ROOT,
                             capture_output=True, check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True, timeout=120)


def _matches(name: str, patterns: list[str]) -> bool:
    return not patterns or any(p in name for p in patterns)


def list_mutants(work: Path, args: argparse.Namespace) -> int:
    """Print the mutants ``args`` selects (named, stale, automatic, equivalent) without running any."""
    named, stale = ([], []) if args.no_named else named_mutants(work, args.only)
    auto = [m for m in auto_mutants(work, args.auto, args.seed) if _matches(m.name, args.auto_match)] if args.auto else []
    for name in stale:
        print(f"STALE       {name}")
    for m in named + auto:
        print(f"{'equivalent' if m.equivalent else 'mutant    '}  {m.name}")
    return 1 if stale else 0


def prepare(work: Path, working_tree: bool, tests: list[str]) -> None:
    """Copy the tree under test into ``work`` (``HEAD``, or the working tree with
    ``working_tree``) and check the planning tests pass there unmutated."""
    copy_tree(work, working_tree)
    cmd = [arg for arg in _pytest(tests) if arg != "-x"] + ["-rfE"]
    r = subprocess.run(cmd, cwd=work, env=_env(work), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    failed = [line[len("FAILED "):].split(" - ")[0] for line in r.stdout.splitlines() if line.startswith("FAILED ")]
    errors = [line for line in r.stdout.splitlines() if line.startswith("ERROR ")]
    if r.returncode != 0 and (errors or not failed):
        print("the planning tests cannot run on the unmutated tree; fix that first:\n" + r.stdout[-3000:], file=sys.stderr)
        raise SystemExit(2)
    for node in failed:  # broken by another change: a mutant must not count as caught by them
        print(f"  BASELINE FAILURE, left out of every run: {node}", flush=True)
    EXTRA_DESELECT.extend(failed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="named mutants to run (default: all)")
    parser.add_argument("--auto", type=int, default=0, help="also run this many automatic mutants")
    parser.add_argument("--auto-match", nargs="*", default=[],
                        help="run only the automatic mutants whose name contains one of these")
    parser.add_argument("--no-named", action="store_true", help="skip the named mutants")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--tests", nargs="*", default=list(PLANNING_TESTS))
    parser.add_argument("--working-tree", action="store_true",
                        help="test the working tree (uncommitted edits included) instead of git HEAD")
    parser.add_argument("--from-head", action="store_true", help="the default; kept for old command lines")
    parser.add_argument("--list", action="store_true", help="print the mutants (stale ones too) and run nothing")
    parser.add_argument("--deselect", nargs="*", default=[],
                        help="pytest node ids to leave out (a test that fails without any mutant)")
    args = parser.parse_args()
    EXTRA_DESELECT.extend(args.deselect)
    # `timeout` / kill send SIGTERM: exit through the context manager so the copy is removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="partita-mutants-") as tmp:
        work = Path(tmp)
        if args.list:
            copy_tree(work, args.working_tree)
            return list_mutants(work, args)
        prepare(work, args.working_tree, args.tests)
        if not args.no_named:
            named, stale = named_mutants(work, args.only)
            for name in stale:
                print(f"  STALE (source no longer matches; fix its text in MUTANTS): {name}")
            print(f"named single-term breaks of src/partita/cost/: {len(named)}")
            check(work, named, args.tests, "named")
        if args.auto:
            auto = [m for m in auto_mutants(work, args.auto, args.seed) if _matches(m.name, args.auto_match)]
            print(f"automatic mutants (seed {args.seed}): {len(auto)}")
            check(work, auto, args.tests, "automatic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
