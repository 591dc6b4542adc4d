"""Write docs/guide.md, the guide to choosing a parallel-training strategy, from Partita's own
numbers: every table is a set of ``partita.estimate`` / ``search_plans`` calls on a named
scenario, so the guide never drifts from the cost model.

    python bench/guide.py            # rewrite docs/guide.md
    python bench/guide.py --check    # exit 1 if docs/guide.md differs from what it would write

Deterministic (no timings, fixed formats, sorted output) and fast (a few searches; about
5 s on an idle core). tests/test_guide.py regenerates it and compares byte for byte.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from partita.errors import PartitaError
from partita.estimate import Estimate, estimate
from partita.plan import Plan, automatic_split
from partita.search.engine import search_plans
from partita.search.explain import why_not
from partita.search.space import SearchSpace
from partita.spec.hardware import make_cluster
from partita.spec.load import load_model

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
ASCEND, GPU = "ascend-910b2", "h100-sxm"


@dataclass(frozen=True)
class Scenario:
    """A named workload: model, devices, sequence length and global batch (sequences)."""

    name: str
    model: str
    devices: int
    seq_len: int
    gbs: int

    def describe(self, hardware: str) -> str:
        return (f"{self.name}: {self.model} on {self.devices} x {hardware}, seq {self.seq_len}, global batch "
                f"{self.gbs} ({self.gbs * self.seq_len / 1e6:.1f}M tokens)")


DENSE = Scenario("dense-65b", "llama-65b", 512, 2048, 2048)
LONG = Scenario("long-context-70b", "llama3-70b", 64, 32768, 64)
MOE = Scenario("moe-8x7b", "mixtral-8x7b", 64, 4096, 512)
UNEVEN = Scenario("uneven-30b", "llama-30b", 64, 2048, 512)


def run(sc: Scenario, hardware: str, **fields) -> Estimate | str:
    """The estimate of one plan of ``sc`` (dp fills the devices), or the one-line reason it is invalid."""
    model = load_model(sc.model)
    cluster = make_cluster(hardware, sc.devices)
    tp, pp, cp = fields.get("tp", 1), fields.get("pp", 1), fields.get("cp", 1)
    fields.setdefault("dp", sc.devices // (tp * pp * cp))
    fields.setdefault("sp", tp > 1)
    if fields.get("vpp", 1) > 1:
        fields.setdefault("schedule", "interleaved-1f1b")
    try:
        return estimate(model, cluster, Plan.from_dict(dict(gbs=sc.gbs, seq_len=sc.seq_len, **fields), "guide"))
    except PartitaError as e:
        return str(e)


HEADER = "| setting | layout | step s | peak GiB | fits | tokens/s/device | MFU |\n|---|---|--:|--:|---|--:|--:|"


def row(label: str, e: Estimate | str) -> str:
    if isinstance(e, str):
        return f"| {label} | - | - | - | invalid: {e} | - | - |"
    fits = {"fits": "yes", "at risk": f"at risk (+{-e.headroom_gib:.1f}, P(fit) {e.p_fit:.2f})"}.get(
        e.verdict, f"no (+{-e.headroom_gib:.1f})")
    return (f"| {label} | `{e.plan.summary()}` | {e.step_time_s:.2f} | {e.peak_memory_gib:.1f} | {fits} | "
            f"{e.tokens_per_s_per_device:,.0f} | {e.mfu:.1%} |")


def table(sc: Scenario, hardware: str, variants: list[tuple[str, dict]]) -> tuple[str, dict[str, Estimate | str]]:
    got = {label: run(sc, hardware, **fields) for label, fields in variants}
    lines = [f"*{sc.describe(hardware)}*", "", HEADER] + [row(label, e) for label, e in got.items()]
    return "\n".join(lines), got


def fastest_fitting(got: dict[str, Estimate | str]) -> str:
    """The fastest setting that fits, in words (the rule's conclusion on this scenario)."""
    ok = {k: e for k, e in got.items() if isinstance(e, Estimate) and e.verdict == "fits"}
    if not ok:
        return "none of these settings fits"
    best = min(ok, key=lambda k: ok[k].step_time_s)
    return f"the fastest setting that fits is **{best}** ({ok[best].step_time_s:.2f} s per step)"


def both(sc: Scenario, variants: list[tuple[str, dict]]) -> str:
    """The same variants on Ascend 910B2 and on H100, each with its conclusion."""
    out = []
    for hw in (ASCEND, GPU):
        text, got = table(sc, hw, variants)
        out += [text, "", f"On {hw}, {fastest_fitting(got)}.", ""]
    return "\n".join(out)


def scaled(sc: Scenario, devices: int) -> Scenario:
    return Scenario(sc.name, sc.model, devices, sc.seq_len, sc.gbs)


def data_parallel() -> str:
    """Same layout (tp 8, pp 4), more replicas: the global batch is fixed, so each replica
    gets fewer micro-batches."""
    out = []
    for hw in (ASCEND, GPU):
        lines = [f"*{DENSE.describe(hw).replace(' on 512 x', ' on N x')}*", "", HEADER]
        got = {}
        for devices in (128, 256, 512, 1024):
            got[f"{devices} devices"] = e = run(scaled(DENSE, devices), hw, tp=8, pp=4, recompute="selective")
            lines.append(row(f"{devices} devices", e))
        first, last = got["128 devices"], got["1024 devices"]
        if isinstance(first, Estimate) and isinstance(last, Estimate):
            eff = last.tokens_per_s_per_device / first.tokens_per_s_per_device
            lines += ["", f"On {hw}, 8x the devices cut the step {first.step_time_s / last.step_time_s:.1f}x; "
                      f"each device keeps {eff:.0%} of its throughput at 1024 devices (pipeline bubble share "
                      f"{_share(first, 'pipeline bubble')} at 128, {_share(last, 'pipeline bubble')} at 1024)."]
        out += lines + [""]
    return "\n".join(out)


def _share(e: Estimate, part: str) -> str:
    return f"{e.time.parts.get(part, 0.0) / e.step_time_s:.1%}"


def bubbles(got: dict[str, Estimate | str]) -> str:
    return "Pipeline bubble share of the step: " + ", ".join(
        f"{k} {_share(e, 'pipeline bubble')}" for k, e in got.items() if isinstance(e, Estimate)) + "."


def pipeline() -> str:
    out = []
    for hw in (ASCEND, GPU):
        text, got = table(DENSE, hw, [(f"pp={p}", dict(tp=8, pp=p, recompute="selective")) for p in (1, 2, 4, 8)])
        out += [text, "", f"On {hw}, {fastest_fitting(got)}. {bubbles(got)}", ""]
    for hw in (ASCEND, GPU):
        text, got = table(DENSE, hw, [(f"vpp={v}", dict(tp=8, pp=4, vpp=v, recompute="selective"))
                                      for v in (1, 2, 4, 5)])
        out += [text, "", f"On {hw}, {fastest_fitting(got)}. {bubbles(got)}", ""]
    return "\n".join(out)


def uneven() -> str:
    """60 layers over 8 stages: Partita's automatic split against a naive one."""
    auto = automatic_split(60, 8)
    # LLaMA-30B has 52 heads: tp 4 divides them
    variants = [("planner's split " + ",".join(map(str, auto)), dict(tp=4, pp=8, layer_split=list(auto))),
                ("naive split 8,8,8,8,7,7,7,7", dict(tp=4, pp=8, layer_split=[8, 8, 8, 8, 7, 7, 7, 7])),
                ("pp=4 (divides 60)", dict(tp=4, pp=4))]
    sc = Scenario(UNEVEN.name, UNEVEN.model, 64, UNEVEN.seq_len, UNEVEN.gbs)
    out = []
    for hw in (ASCEND, GPU):
        text, got = table(sc, hw, [(k, dict(v, recompute="selective")) for k, v in variants])
        out += [text, "", f"On {hw}, {fastest_fitting(got)}.", ""]
    return "\n".join(out)


def precision() -> str:
    out = []
    for hw in (ASCEND, GPU):
        text, got = table(DENSE, hw, [(dt, dict(tp=8, pp=4, recompute="selective", dtype=dt))
                                      for dt in ("bf16", "fp8", "fp32")])
        out += [text, "", f"On {hw}, {fastest_fitting(got)}.", ""]
    return "\n".join(out)


SEARCHES = [(DENSE, ASCEND), (DENSE, GPU), (LONG, ASCEND), (LONG, GPU), (MOE, ASCEND), (MOE, GPU)]


def searches() -> str:
    """partita plan's answer on each scenario: the top 3 and the first why-not lines."""
    out = []
    for sc, hw in SEARCHES:
        model, cluster = load_model(sc.model), make_cluster(hw, sc.devices)
        result = search_plans(model, cluster, sc.gbs, sc.seq_len, SearchSpace(), top=3)
        out += [f"**{sc.describe(hw)}** (memory limit {result.memory_limit_gib:.1f} GiB = usable less 5% headroom)", ""]
        if not result.plans:
            out += ["No plan fits.", ""]
            continue
        out.append(HEADER)
        out += [row(f"plan {i}", e) for i, e in enumerate(result.plans, 1)]
        out += ["", "Why not:", ""] + [f"- {line}" for line in why_not(result)[:6]] + [""]
    return "\n".join(out)


INTRO = """# Choosing a parallel-training strategy (Ascend 910B and GPUs)

*Generated by `python bench/guide.py` from Partita's own estimates and searches; do not edit by
hand. `tests/test_guide.py` regenerates it and fails if it differs, so every number below is what
the current cost model says.*

Every table holds one layout fixed and changes one knob, on a named scenario, once on
Ascend 910B2 (64 GiB HBM, HCCS full mesh of 8 inside a node, RoCE between) and once on H100 SXM
(80 GiB, NVLink switch of 8, InfiniBand between). Columns: the layout (`dp/tp/pp/cp/ep`
degrees, `+sp` sequence parallel, `pp4v2` 4 stages x 2 interleaved chunks, `z` ZeRO stage,
`mbs1x32` micro-batch 1 x 32 accumulation steps, `rc-` recomputation), step time, the peak
memory of the most loaded rank, whether it **fits** - one definition everywhere (estimate, plan,
import, reports): "yes" when the peak, allocator slack and runtime reservation included, is at
most the device's usable memory; "at risk (+x, P(fit) p)" when it is x GiB over but the
out-of-sample memory residuals still give it a P(fit) of at least 5 % (the search keeps such
plans, marked); "no (+x)" below that - then tokens/s per device and MFU.

How to use it: run `partita plan` for your model, cluster and batch; it searches every
combination below in about a second and prints why it did not pick the nearest alternatives
(`partita plan --report plan.html` draws them: plans side by side, memory per pipeline rank,
where the step time goes, the schedule of one step, scaling with the number of devices).
The rules here explain those answers; the numbers are predictions (see `docs/cost_model.md`
for their accuracy against published runs; Ascend efficiencies are less certain than the GPUs':
fewer published runs to fit - `partita calibrate` measures yours).

Scenarios: **dense-65b** (LLaMA-65B, 512 devices, 2048-token sequences, 2048-sequence global
batch), **long-context-70b** (Llama-3-70B, 64 devices, 32k tokens), **moe-8x7b**
(Mixtral-8x7B, 64 devices, 4k tokens), **uneven-30b** (LLaMA-30B, 60 layers, 64 devices).
"""

SECTIONS = [
    ("## 1. Data parallelism", """Data parallelism (dp) is the cheapest axis: each replica runs the whole
model on its share of the batch and the gradients are reduced once per step, overlapped with the
last backward. With a fixed global batch, more replicas mean fewer micro-batches per replica, so
a pipelined layout's bubble grows and the per-device throughput falls; and the batch per replica
cannot go below one micro-batch. Add devices along dp first; when dp alone does not fit the
model in memory, combine it with the axes below.""", data_parallel),
    ("## 2. Tensor and sequence parallelism", """Tensor parallelism (tp) splits every layer's weights and
activations tp ways, at the price of collectives in every layer (two all-reduces forward and two
backward per block, Korthikanti et al. 2022); sequence parallelism (`+sp`) turns them into
all-gather/reduce-scatter of the same volume and also splits the activations between them, so
Partita always turns it on with tp. Keep the tp group inside a node: tp=16 here crosses nodes and
its per-layer collectives go over the network. Use the smallest tp that fits.""",
     lambda: both(DENSE, [(f"tp={t}", dict(tp=t, pp=4, recompute="selective")) for t in (1, 2, 4, 8, 16)])),
    ("## 3. Pipeline parallelism, interleaving and uneven splits", """Pipeline parallelism (pp) gives each
rank a contiguous block of layers and streams micro-batches through them: per-rank weights fall
as 1/pp with little communication (one activation per micro-batch), but the pipeline fills and
drains once per step - the bubble, (pp - 1)/(m + pp - 1) of a uniform pipeline with m
micro-batches (Narayanan et al. SC'21). Interleaving (vpp virtual chunks per rank) divides the
bubble by vpp for more point-to-point traffic and more in-flight activations on the first rank.
Use pp when tp inside a node is not enough, with many micro-batches per step.""", pipeline),
    ("### Uneven splits", """When the layers do not divide into the stages, the first stage also holds the
embedding and the last the output layer and loss: Partita's automatic split (Megatron's
`--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split`) gives those
stages a layer less; the search balances the measured end costs. A split that piles the extra
layers on the first stages makes them the slowest stage and the most loaded rank.""", uneven),
    ("## 4. Context parallelism (long sequences)", """Context parallelism (cp) splits the sequence: each rank
keeps 1/cp of the tokens' activations and the ranks pass K/V around a ring while attention runs
(ring attention). The hop is linear in the sequence and hides behind attention work quadratic in
it, so cp pays off for long sequences (the search only tries it with at least 2048 tokens per
rank). Use it when the activations of one sequence do not fit even with tp and recompute.""",
     lambda: both(LONG, [(f"cp={c}", dict(tp=8, pp=2, cp=c, recompute="selective")) for c in (1, 2, 4)])),
    ("## 5. Expert parallelism (mixture of experts)", """Expert parallelism (ep) spreads a MoE layer's experts
over ep ranks of the data-parallel group; tokens travel to their experts and back by all-to-all
(twice forward, twice backward). Expert weights dominate a MoE model's memory, so ep is usually
what makes it fit; keep the ep group inside a node where its all-to-all runs over HCCS/NVLink.""",
     lambda: both(MOE, [(f"ep={e}", dict(tp=2, ep=e, recompute="selective")) for e in (1, 2, 4, 8)])),
    ("## 6. ZeRO stages", """ZeRO-1 (Megatron's distributed optimizer) shards the optimizer states over dp for
the same traffic as a plain all-reduce (reduce-scatter + all-gather): with dp > 1 it is free
memory. ZeRO-2 also shards the gradients, but with gradient accumulation it reduce-scatters every
micro-batch (Partita's default, sharded accumulation), which costs when micro-batches are many.
ZeRO-3 (FSDP) also shards the weights and gathers them for every micro-batch: the least memory,
the most traffic. Use 1 by default, 2 or 3 only when memory demands it, with few micro-batches.""",
     lambda: both(DENSE, [(f"zero={z}", dict(tp=8, zero=z, recompute="selective")) for z in (0, 1, 2, 3)])),
    ("## 7. Activation recomputation", """Recomputation trades compute for activation memory. What
selective recomputation reruns depends on the framework: Megatron-LM (the default here) reruns its
core attention (Korthikanti et al. 2022), which with a flash kernel frees only the kernel's
log-sum-exp - little memory for little time; torchtitan's op-level selective (every other GEMM and
the element-wise work) frees about half of a layer's activations for a few percent of time. Full
recomputation keeps only each layer's input and runs the forward again (about a third more
compute). Use none if it fits, selective next, full only when nothing else fits.""",
     lambda: both(DENSE, [(f"recompute={r}", dict(tp=8, pp=4, recompute=r)) for r in ("none", "selective", "full")])),
    ("## 8. Micro-batch size and gradient accumulation", """The global batch is micro-batch x accumulation
steps x dp. A larger micro-batch keeps the GEMMs busier and, in a pipeline, leaves fewer
micro-batches per step (a larger bubble) and more activation memory in flight. Pick the
micro-batch that fits with the most micro-batches per pipeline; without a pipeline, the largest
that fits.""",
     lambda: both(DENSE, [(f"mbs={m}", dict(tp=8, pp=4, mbs=m, recompute="selective")) for m in (1, 2, 4, 8)])),
    ("## 9. Precision", """bf16 with fp32 master weights is the default. fp8 (H100 and newer; Ascend 910B has
no fp8 GEMMs, so Partita refuses it there) doubles the GEMM peak and halves the tp/ep traffic but
keeps the fp32 optimizer states. fp32 training doubles weights, activations and traffic and runs
at the fp32 peak: a last resort. MFU is computed against the bf16 peak for every row, so rows
compare.""", precision),
    ("## 10. Gradient compression", """*Placeholder.* Data-parallel gradient compression (bf16 gradient
reduction, PowerSGD low-rank compression) and the other data-parallel communication knobs are
described, with their numbers, in [docs/compression.md](compression.md). Once their cost terms
settle, this section will hold a generated table like the others.""", None),
    ("## 11. What the search picks", """`partita plan` on each scenario (top 3, default search space, 5%
headroom): the whole space at once, with the nearest rejected alternatives and why.""", searches),
]


def render() -> str:
    parts = [INTRO]
    for heading, text, make in SECTIONS:
        parts += [heading, "", text, ""]
        if make is not None:
            parts.append(make().rstrip("\n"))
            parts.append("")
    return "\n".join(parts).rstrip("\n") + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/guide.md is not what this writes")
    p.add_argument("-o", "--output", default=str(GUIDE))
    args = p.parse_args()
    text = render()
    if args.check:
        same = Path(args.output).read_text(encoding="utf-8") == text
        print(f"{args.output}: {'up to date' if same else 'differs: run python bench/guide.py'}")
        return 0 if same else 1
    Path(args.output).write_text(text, encoding="utf-8")
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
