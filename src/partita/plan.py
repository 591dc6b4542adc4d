"""The framework-neutral parallel plan: one JSON format every Partita command reads.

Glossary (the field names are the field's own short names):

=========  ===================================================================
dp         data-parallel replicas (each sees a different slice of the batch)
tp         tensor parallel: every GEMM of a layer split over ``tp`` devices
           [Shoeybi et al. 2019, Megatron-LM]
sp         sequence parallel: with tp, norms/dropout shard the sequence and the
           all-reduces become all-gather + reduce-scatter [Korthikanti et al. 2022]
pp         pipeline stages (layers split into ``pp`` consecutive groups)
vpp        virtual stages (model chunks) per pipeline rank: interleaved 1F1B
           [Narayanan et al. SC'21]
cp         context parallel: the sequence split over ``cp`` devices, K/V exchanged
           in a ring (ring attention / Megatron CP)
ep         expert parallel: routed experts split over ``ep`` devices, tokens
           exchanged with all-to-all; carved out of dp x cp as Megatron does, so it
           is not a factor of the world size [Megatron-Core MoE]. An ep that does not
           divide dp x cp is folded out of tp x dp x cp (Megatron-Core "MoE parallel
           folding": the expert layers get their own tp x dp x cp = etp x ep x edp
           mesh, here with expert tensor parallel etp = 1 - experts are never split
           by tp - so ep must divide tp x dp x cp) [Liu et al. 2025, arXiv:2504.14960]
etp        expert tensor parallel (default 1): each routed expert's FFN split ``etp`` ways
           (w1/w3 by columns, w2 by rows) - Megatron-Core ``--expert-tensor-parallel-size``.
           The expert layers of a pipeline stage are re-folded as the grid
           ``etp x ep x edp = tp x cp x dp`` (MoE parallel folding [Liu et al. 2025,
           arXiv:2504.14960, sec. 3]); the expert data-parallel size ``edp = tp*cp*dp /
           (ep*etp)`` is derived. Ranks: Megatron-Core's expert RankGenerator, order
           ``tp-ep-dp-pp`` (megatron/core/parallel_state.py): etp innermost (consecutive
           ranks), ep ``etp`` apart, edp ``etp*ep`` apart. etp = 1 keeps the layout
           described under ``ep``.
zero       0: replicated optimizer (DDP); 1: optimizer states sharded over dp x cp
           (Megatron distributed optimizer); 2: + gradients sharded; 3: + parameters
           sharded (FSDP / ZeRO-3) [Rajbhandari et al. 2020]
mbs        micro-batch size in sequences per device
gbs        global batch in sequences; gradient accumulation ``gbs / (dp * mbs)``
recompute  none | selective (recompute attention core) | full (store only each
           layer's input) [Korthikanti et al. 2022]
recompute_layers
           with recompute full: recompute only the first N layers of every pipeline
           stage (each virtual chunk with vpp > 1); the others keep their activations as
           with recompute none. Megatron-LM's ``--recompute-granularity full
           --recompute-method block --recompute-num-layers N`` (TransformerBlock
           ``_checkpointed_forward``: ``layer_idx < recompute_num_layers`` of the
           chunk's own layers is checkpointed). 0 (default): every layer (today's full).
           An integer, not a fraction: Megatron's flag is a count per chunk, so a count
           exports and imports exactly; a fraction would round differently per stage of
           an uneven split. torchtitan's layer-wise AC (``selective_ac_option = "k"``,
           every k-th block) checkpoints ``floor(L / k)`` blocks of an L-layer stage; the
           count is what memory and FLOPs depend on, so it maps to that N. Megatron's
           ``--recompute-method uniform --recompute-num-layers k`` recomputes every
           layer (k layers share one checkpoint): recompute full with N = 0, whose
           activation count (one input per layer) is then an upper bound.
dtype      bf16 | fp16 | fp8 (GEMMs in fp8, the rest bf16) | fp32
schedule   1f1b | gpipe | interleaved-1f1b | zero-bubble | dualpipev (DeepSeek's V-shaped bidirectional
           schedule: vpp 2, chunk ``j`` of ``2 pp`` on rank ``j`` for ``j < pp`` else ``2 pp - 1 - j``, so rank 0
           holds the first and the last chunk; >= 2 pp micro-batches; torch ``ScheduleDualPipeV``;
           bubble and overlap: cost/pipeline.py)
grad_accum_mode
           with zero 2/3 and gradient accumulation: ``sharded`` (default) reduce-
           scatters every micro-batch into the gradient shard (gradients held:
           1/dp; traffic: one reduce-scatter per micro-batch); ``unsharded`` keeps
           the full gradient until the last micro-batch and reduces once (gradients
           held: full; traffic: one reduce-scatter per step) [FSDP2
           ``set_requires_gradient_sync``]. zero 0/1 ignore it (they hold full
           gradients and all-reduce once per step).
dp_shard   HSDP with zero 1-3: shard within groups of ``dp_shard`` consecutive dp
           ranks and replicate across the ``dp / dp_shard`` groups (gradients
           reduce-scattered in the group, then all-reduced across groups)
           [FSDP2 on a 2-D mesh; Zhao et al. 2023, PyTorch FSDP, sec. 3.2.2];
           with zero 1 only the optimizer states are sharded so (Megatron-LM
           ``--num-distributed-optimizer-instances dp/dp_shard``; InternLM's hybrid
           ZeRO "zero1 = dp_shard"); 0 (default): shard over all of dp.
grad_compression
           none (default) | powersgd: rank-``powersgd_rank`` low-rank compression of
           every gradient matrix before the data-parallel all-reduce, with error
           feedback [Vogels et al. 2019, PowerSGD]; needs zero 0 (it all-reduces the
           factors; sharded reductions cannot carry them). Bytes and compute:
           :mod:`partita.cost.compression`.
ddp_bucket_mb
           gradient bucket size (MiB) of the data-parallel all-reduce (DDP
           ``bucket_cap_mb``; Megatron ``--ddp-bucket-size``); 0: the framework default
fsdp_prefetch
           FSDP2 forward/backward all-gather prefetch depth (blocks ahead; 1: FSDP2's
           implicit one-block prefetch, the default)
attention  fused (default: flash / fused attention, the scores never stored) | unfused
           (the softmax probabilities of every layer are kept for backward: Megatron-Core
           ``--attention-backend unfused``, eager attention); memory: cost/memory.py; time: the
           full score square as GEMMs plus its HBM passes (cost/compute.py unfused_attention_core)
fp8_param_gather
           fp8 plans with zero 1-3: the weights are TE fp8 tensors (1 byte), no bf16 copy
           (Megatron ``--fp8-param-gather``); bytes: cost/states.py
reuse_fp32_param
           bf16 plans with zero 0-2: the fp32 master weight is the bf16 weight plus a
           16-bit residual (MindSpeed ``--reuse-fp32-param``); bytes: cost/states.py
moment_dtype
           the storage dtype of Adam's two moments (Megatron ``--use-precision-aware-optimizer
           --exp-avg-dtype X --exp-avg-sq-dtype X``): fp32 (default), bf16, fp16, fp8;
           bytes: cost/states.py
recompute_modules
           with recompute selective under Megatron: the ``--recompute-modules`` it recomputes,
           comma-separated (core_attn, moe_act, layernorm, mla_up_proj, mlp, moe,
           shared_experts); empty: Partita's op-level selective; bytes: cost/activations.py
optimizer_offload
           the fraction of the optimizer states (fp32 master weight, Adam moments) held in
           host memory (Megatron ``--optimizer-cpu-offload --optimizer-offload-fraction``);
           bytes: cost/states.py (memory only: the host step and copies are not timed)
=========  ===================================================================

The mesh axis order (outermost first) is :data:`MESH_AXES`; the cost model (which link
a group crosses) and the runtime (which ranks form a group) both use :func:`axis_ranks`.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import PartitaError
from .inputs import MAX_VPP

#: Device-mesh axes, outermost first: tp is innermost (fastest link), pp outermost.
MESH_AXES: tuple[str, ...] = ("pp", "dp", "cp", "tp")

#: The allowed values of the plan's fields with a fixed set (here only: the flags, the
#: search and the training config import them; :func:`field_problem` checks them).
RECOMPUTE = ("none", "selective", "full")
DTYPES = ("bf16", "fp16", "fp8", "fp32")
SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble", "dualpipev")
GRAD_ACCUM_MODES = ("sharded", "unsharded")
ATTENTIONS = ("fused", "unfused")
#: ``fp8_recipe``: how fp8 GEMM inputs are scaled: one scale per tensor (tensorwise, the default),
#: per row (rowwise, torchao) or per 32-element block (mxfp8); torchtitan casts a tensorwise
#: input to fp8 before the tp all-gather (cost/frameworks.py ``fp8_tp_gather``)
FP8_RECIPES = ("tensorwise", "rowwise", "mxfp8")
GRAD_DTYPES = ("fp32", "bf16")
GRAD_COMPRESSIONS = ("none", "powersgd")
#: ``finetune``: none (pre-training: every weight trained), full (SFT of every weight), lora (frozen
#: base weights, low-rank adapters trained); ``lora_targets``: which linears get an adapter
FINETUNES = ("none", "full", "lora")
LORA_TARGETS = ("attention", "qkv", "mlp", "all-linear")
ZERO_STAGES = (0, 1, 2, 3)
#: ``framework``: what the plan is estimated as run by (partita.cost.frameworks holds each one's differences)
FRAMEWORKS = ("megatron", "mindspeed", "torchtitan", "torchtitan-eager", "torchtitan-eager-loss", "deepspeed", "partita", "internevo",
              "mindformers")
PLAN_FORMAT = "partita.plan/1"
#: Upper bound of every degree and size of a plan: beyond any real run (2^24 devices,
#: sequences or tokens), so that every estimate and export finishes in bounded time.
MAX_PLAN_SIZE = 1 << 24
#: Megatron-Core's ``--recompute-modules`` choices whose memory Partita models (transformer_config.py).
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
#: Fields written to JSON only when set to something else than this default.
_OPTIONAL_DEFAULTS: dict[str, object] = {"etp": 1, "grad_compression": "none", "powersgd_rank": 4, "ddp_bucket_mb": 0,
                                         "fsdp_prefetch": 1, "grad_accum_mode": "sharded", "dp_shard": 0, "framework": "megatron",
                                         "recompute_layers": 0, "attention": "fused", "fp8_recipe": "tensorwise",
                                         "finetune": "none", "lora_rank": 16, "lora_alpha": 32.0,
                                         "lora_targets": "all-linear", "lora_dropout": 0.0, "fp8_param_gather": False,
                                         "reuse_fp32_param": False, "sample_len": 0,
                                         "optimizer_offload": 0.0, "recompute_modules": "",
                                         "moment_dtype": "fp32"}


#: The commands whose flags are generated from a field (:func:`_flag`): ``estimate`` takes
#: every field; ``plan`` (the search) fixes the ones it would otherwise search.
_BOTH = ("estimate", "plan")
_ESTIMATE = ("estimate",)


def _flag(default: Any, help: str, *, flag: str | None = None, aliases: tuple[str, ...] = (),
          choices: tuple | None = None, bounds: tuple[float, float] | None = None, commands: tuple[str, ...] = _ESTIMATE,
          bounds_text: str | None = None) -> Any:
    """A plan field with what its command-line flag and its check are generated from, so that
    the flag, a plan string, a plan file and :func:`validate` refuse a bad value with the same
    words (:func:`field_problem`): ``help``, the ``choices`` or numeric ``bounds`` (low, high)
    it must lie in (``bounds_text`` words the range where its low end means something), the
    ``flag`` spelling (default ``--`` + the field name with dashes) and other names (``aliases``), and
    the ``commands`` that offer it (``partita.cli.plan_flags`` builds the flags; only cli/
    imports argparse)."""
    meta = {"help": help, "flag": flag, "aliases": aliases, "choices": choices, "bounds": bounds,
            "commands": commands, "bounds_text": bounds_text}
    return field(default=default, metadata=meta)


_DEGREE = (1, MAX_PLAN_SIZE)


@dataclass(frozen=True)
class Plan:
    """How one training job is split; see the module docstring for each field."""

    dp: int = _flag(1, "data-parallel replicas (default: devices / (tp*pp*cp))", bounds=_DEGREE, commands=_BOTH)
    tp: int = _flag(1, "tensor-parallel degree", bounds=_DEGREE, commands=_BOTH)
    pp: int = _flag(1, "pipeline stages", bounds=_DEGREE, commands=_BOTH)
    vpp: int = _flag(1, "virtual stages per pipeline rank (interleaved 1F1B)", bounds=(1, MAX_VPP), commands=_BOTH)
    cp: int = _flag(1, "context-parallel degree", bounds=_DEGREE, commands=_BOTH)
    ep: int = _flag(1, "expert-parallel degree (MoE)", bounds=_DEGREE, commands=_BOTH)
    sp: bool = _flag(False, "sequence parallel (default: on when tp > 1)")
    zero: int = _flag(1, "ZeRO stage (default 1)", choices=ZERO_STAGES, commands=_BOTH)
    mbs: int = _flag(1, "micro-batch size in sequences", bounds=_DEGREE, commands=_BOTH)
    gbs: int = _flag(1, "global batch in sequences", flag="--global-batch", aliases=("--gbs",), bounds=_DEGREE,
                     commands=_BOTH)
    seq_len: int = _flag(2048, "sequence length in tokens", bounds=_DEGREE, commands=_BOTH)
    recompute: str = _flag("none", "activation recomputation", choices=RECOMPUTE, commands=_BOTH)
    dtype: str = _flag("bf16", "training precision", choices=DTYPES, commands=_BOTH)
    schedule: str = _flag("1f1b", "pipeline schedule (default: interleaved-1f1b with vpp > 1, else 1f1b; "
                                  "dualpipev: vpp 2 in a V)", choices=SCHEDULES, commands=_BOTH)
    # layers per virtual stage, pp*vpp entries, in pipeline order
    layer_split: tuple[int, ...] | None = _flag(None, "layers per virtual stage, e.g. 9,10,10,9")
    # main-gradient buffer and reduction dtype (Megatron-LM fp32; NeMo bf16)
    grad_dtype: str = _flag("fp32", "dtype of the data-parallel gradient reduction (bf16 halves its bytes; "
                                    "default fp32)", choices=GRAD_DTYPES)
    tp_comm_overlap: bool = _flag(False, "overlap tensor-parallel communication (Megatron --tp-comm-overlap, "
                                         "Ascend MC2)")
    overlap_grad_reduce: bool = _flag(True, "overlap the data-parallel gradient reduction with backward (default on)")
    overlap_param_gather: bool = _flag(True, "overlap the ZeRO parameter all-gather with forward (default on)")
    # Fields added after format partita.plan/1 was fixed: to_dict writes each only when it
    # differs from its default (:data:`_OPTIONAL_DEFAULTS`), so existing plans keep their JSON.
    grad_accum_mode: str = _flag("sharded", "with zero 2/3 and gradient accumulation: reduce-scatter every "
                                            "micro-batch (sharded, default) or once per step (unsharded)",
                                 choices=GRAD_ACCUM_MODES)
    dp_shard: int = _flag(0, "HSDP: shard within groups of this many dp ranks, replicate across them "
                             "(default 0: all of dp)", bounds=(0, MAX_PLAN_SIZE))
    grad_compression: str = _flag("none", "low-rank gradient compression of the data-parallel all-reduce "
                                          "(zero 0; default none)", choices=GRAD_COMPRESSIONS)
    powersgd_rank: int = _flag(4, "PowerSGD rank (default 4)", bounds=(1, 1024), commands=_BOTH)
    ddp_bucket_mb: int = _flag(0, "DDP gradient bucket size in MiB (default 0: the framework's)", bounds=(0, 65536))
    fsdp_prefetch: int = _flag(1, "FSDP2 all-gather prefetch depth in blocks (default 1)", bounds=(1, 8))
    #: the framework the plan is estimated as run by (cost/frameworks.py: its documented
    #: differences in saved activations, recompute, state bytes and overlap)
    framework: str = _flag("megatron", "estimate as run by this framework: torchtitan-eager is torchtitan without "
                                       "torch.compile, torchtitan-eager-loss compiled blocks with an eager loss "
                                       "(torchtitan before 2025-04), internevo the InternLM trainer, mindformers MindSpore's; their documented "
                                       "differences: docs/cost_model.md (default megatron)",
                           choices=FRAMEWORKS, commands=_BOTH)
    #: expert tensor parallel (module docstring, ``etp``); 1 keeps every plan's JSON as before
    etp: int = _flag(1, "expert tensor parallel: each routed expert's FFN split etp ways, the expert grid "
                        "etp x ep x edp folded out of tp x cp x dp (Megatron --expert-tensor-parallel-size; "
                        "default 1)", bounds=_DEGREE, commands=_BOTH)
    #: with recompute full, layers recomputed per stage/chunk (module docstring); 0 = all
    recompute_layers: int = _flag(0, "with --recompute full: recompute only the first N layers of each pipeline "
                                     "stage/chunk (Megatron --recompute-method block --recompute-num-layers N; "
                                     "default 0: all)", bounds=(0, MAX_PLAN_SIZE),
                                  bounds_text="must be 0 (all layers) or a positive layer count")
    #: attention kernel: fused (flash) or unfused (probabilities kept; module docstring)
    attention: str = _flag("fused", "attention kernel: fused (flash; default) or unfused (the softmax "
                                    "probabilities kept for backward)", choices=ATTENTIONS)
    #: with dtype fp8: the scaling recipe (FP8_RECIPES)
    fp8_recipe: str = _flag("tensorwise", "with --dtype fp8: scaling recipe, tensorwise (one scale per tensor; "
                                          "default), rowwise or mxfp8", choices=FP8_RECIPES)
    #: fine-tuning: none (pre-training), full SFT or LoRA (partita.cost.finetune: frozen weights
    #: without gradients or optimizer states, adapters with theirs; docs/finetune.md)
    finetune: str = _flag("none", "fine-tuning: none (pre-training; default), full (SFT, every weight trained) or "
                                  "lora (frozen base weights, low-rank adapters trained)", choices=FINETUNES,
                          commands=_BOTH)
    lora_rank: int = _flag(16, "LoRA rank r of every adapter (with --finetune lora; default 16)", bounds=(1, 65536),
                           commands=_BOTH)
    lora_alpha: float = _flag(32.0, "LoRA alpha (scale alpha/r; with --finetune lora; default 32)", commands=_BOTH)
    lora_targets: str = _flag("all-linear", "linears given a LoRA adapter: attention (q,k,v,o), qkv (q,k,v: NeMo "
                                            "1.x's attention_qkv default), mlp (gate,up,down) or all-linear (default)",
                              choices=LORA_TARGETS, commands=_BOTH)
    #: dropout on each adapter's input (PEFT / ms-swift / LLaMA-Factory ``lora_dropout``; ms-swift's default is
    #: 0.05): each adapter then keeps its own dropped copy of its input and a mask (cost/finetune.py)
    lora_dropout: float = _flag(0.0, "LoRA dropout on each adapter's input (PEFT lora_dropout; with --finetune lora; "
                                     "default 0): each adapter keeps a dropped copy of its input and a mask",
                                bounds=(0, 0.99), bounds_text="is a dropout probability, from 0 to below 1",
                                commands=_BOTH)
    #: weight storage knobs read from Megatron/MindSpeed scripts (issue 32; cost/states.py has the bytes):
    #: fp8 weights with no bf16 copy (Megatron --fp8-param-gather), and the fp32 master weight kept as the
    #: bf16 weight plus a 16-bit residual (MindSpeed --reuse-fp32-param)
    fp8_param_gather: bool = _flag(False, "with --dtype fp8: keep the weights in fp8 only (no bf16 copy) and "
                                          "all-gather them in fp8 (Megatron --fp8-param-gather; needs zero >= 1)")
    reuse_fp32_param: bool = _flag(False, "keep the fp32 master weight as the bf16 weight plus a 16-bit residual "
                                          "(MindSpeed --reuse-fp32-param; bf16/fp8, zero 0-2)")
    #: Adam's moments stored in a narrower dtype (Megatron --use-precision-aware-optimizer; cost/states.py)
    moment_dtype: str = _flag("fp32", "storage dtype of Adam's exp_avg and exp_avg_sq (Megatron "
                                      "--use-precision-aware-optimizer --exp-avg-dtype/--exp-avg-sq-dtype; zero 1-2)",
                              choices=("fp32", "bf16", "fp16", "fp8"), commands=_BOTH)
    #: Megatron-Core's module-level selective recompute (--recompute-modules; cost/activations.py)
    recompute_modules: str = _flag("", "with --recompute selective: Megatron's --recompute-modules, comma-separated "
                                       "(core_attn, moe_act, layernorm, mla_up_proj, mlp, moe, shared_experts); "
                                       "empty (default): Partita's op-level selective checkpointing", commands=_BOTH)
    #: the fraction of the optimizer states kept in host memory (Megatron --optimizer-cpu-offload, whose
    #: HybridDeviceOptimizer steps that share on the CPU; --optimizer-offload-fraction, default 1.0)
    optimizer_offload: float = _flag(0.0, "fraction (0-1) of the optimizer states (fp32 master, Adam moments) kept "
                                          "in host memory (Megatron --optimizer-cpu-offload "
                                          "--optimizer-offload-fraction; memory only, the host step is not timed)",
                                   bounds=(0, 1), bounds_text="is the fraction of the optimizer states in host memory, "
                                               "from 0 to 1", commands=_BOTH)
    #: packed sequences whose attention runs per sample (document mask / varlen, as Partita's runtime,
    #: NeMo's packed THD and LLaMA-Factory's neat_packing do): the samples' length-weighted mean length
    #: sum(L^2) / sum(L), the causal attention span per token; 0: one sample fills the sequence (cost/compute.py)
    sample_len: int = _flag(0, "packed samples with attention per sample: their length-weighted mean length "
                               "sum(L^2)/sum(L) in tokens (0, the default: one sample per sequence)",
                            bounds=(0, MAX_PLAN_SIZE), commands=_BOTH,
                            bounds_text="must be 0 (one sample per sequence) or a sample length in tokens")

    def __post_init__(self) -> None:
        """``recompute_modules`` canonical however the plan is built (:func:`canonical_modules`:
        a list from Python or JSON, repeats, order); a value it cannot read is left for
        :func:`validate` to name."""
        modules = self.recompute_modules
        if modules != "":
            try:
                object.__setattr__(self, "recompute_modules", canonical_modules(modules))
            except ValueError:
                pass

    def with_(self, **changes: Any) -> "Plan":
        """A copy with ``changes`` (unvalidated; a faster ``dataclasses.replace`` for the search)."""
        new = object.__new__(Plan)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    # ------------------------------------------------------------ derived
    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def grad_accum(self) -> int:
        """Micro-batches per step on each pipeline (gradient accumulation steps)."""
        return self.gbs // (self.dp * self.mbs)

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq_len

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        """Layers of each virtual stage in pipeline order (pp*vpp entries): the plan's
        ``layer_split``, else an even split, else (layers not divisible by pp*vpp) the
        automatic one of :func:`automatic_split`."""
        if self.layer_split:
            return tuple(self.layer_split)
        chunks = self.pp * self.vpp
        if layers % chunks:
            split = automatic_split(layers, chunks)
            if split:
                return split
        return tuple([layers // chunks] * chunks)

    def summary(self) -> str:
        parts = [f"dp{self.dp}", f"tp{self.tp}"]
        if self.sp and self.tp > 1:
            parts[-1] += "+sp"
        parts.append(f"pp{self.pp}" + ("-dualpipev" if self.schedule == "dualpipev" and self.pp > 1
                                       else f"v{self.vpp}" if self.vpp > 1 else ""))
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp > 1:
            parts.append(f"etp{self.etp}")
        parts.append(f"z{self.zero}")
        parts.append(f"mbs{self.mbs}x{self.grad_accum}")
        if self.recompute != "none":
            parts.append(f"rc-{self.recompute}" + (f":{self.recompute_layers}" if self.recompute_layers else "")
                         + (f"[{self.recompute_modules}]" if self.recompute == "selective" and self.recompute_modules
                            else ""))
        if 0 < self.dp_shard < self.dp:
            parts.append(f"hsdp{self.dp_shard}")
        if self.grad_accum_mode != "sharded" and self.zero >= 2 and self.grad_accum > 1:
            parts.append("ga-unsharded")
        if self.grad_compression == "powersgd":
            parts.append(f"psgd{self.powersgd_rank}")
        elif self.grad_dtype == "bf16" and self.dtype != "fp32":
            parts.append("g-bf16")
        if self.finetune != "none":
            parts.append("sft-full" if self.finetune == "full" else f"lora{self.lora_rank}-{self.lora_targets}"
                         + (f"-drop{self.lora_dropout:g}" if self.lora_dropout else ""))
        return " ".join(parts)

    # ------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layer_split"] = list(self.layer_split) if self.layer_split else None
        for name, default in _OPTIONAL_DEFAULTS.items():
            if d[name] == default:
                del d[name]
        return {"format": PLAN_FORMAT, **d, "grad_accum": self.grad_accum}

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> "Plan":
        # derived (grad_accum), or what `partita import --json` adds beside the plan (not_modelled, model, reading_note)
        data = {k: v for k, v in data.items()
                if k not in ("format", "grad_accum", "not_modelled", "model", "reading_note")}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise PartitaError(f"{where}: unknown field(s) {', '.join(unknown)}; plan fields are {', '.join(sorted(known))}")
        typed: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            typed[f.name] = _coerce(f.name, data[f.name], where)
        plan = cls(**typed)
        if "sp" not in data:
            plan = replace(plan, sp=plan.tp > 1)
        if "schedule" not in data and plan.vpp > 1:
            plan = replace(plan, schedule="interleaved-1f1b")
        if plan.schedule == "dualpipev" and "vpp" not in data and plan.pp > 1:  # its two chunks per rank are implied
            plan = replace(plan, vpp=2)
        return plan

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        """The plan in the JSON file ``path`` (:func:`plan_from_json` reads what it holds)."""
        from .inputs import read_json
        data = read_json(path, "plan")  # one-line errors for missing/directory/non-UTF-8/non-JSON/deep files
        return plan_from_json(data, f"plan file {path}")

    @classmethod
    def parse(cls, text: str, world_size: int | None = None, defaults: dict[str, Any] | None = None) -> "Plan":
        """The plan ``text`` names: a plan file's path, the JSON text of a plan, or
        ``"dp=2,tp=2,mbs=1"`` - the one reader of a ``--plan`` value, used by every command.

        In a ``key=value`` string, fields not given come from ``defaults``, then
        :func:`plan_from_fields` (dp fills ``world_size`` when given). A file or JSON text is
        the whole plan (``defaults`` do not apply)."""
        text = str(text)
        if text.lstrip().startswith("{"):
            from .inputs import loads_json
            return plan_from_json(loads_json(text, "--plan JSON", "plan"), "--plan JSON")
        if text.endswith(".json") or _is_file(text):
            return cls.load(text)
        data: dict[str, Any] = dict(defaults or {})
        given: set[str] = set()
        for item in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in item:
                raise PartitaError(f"plan item {item!r} must be key=value, e.g. tp=2")
            key, value = (s.strip() for s in item.split("=", 1))
            if not key or key in given:
                raise PartitaError(f"plan item {item!r}: " + ("a field name is missing before '='" if not key
                                                              else f"{key} is given twice"))
            given.add(key)
            data[key] = value
        return plan_from_fields(data, world_size)


_FIELDS = {f.name: f for f in fields(Plan)}
#: (name, choices, low, high) of every field with allowed values or bounds (:func:`_field_problems`)
_CHECKS = tuple((f.name, f.metadata["choices"], *(f.metadata["bounds"] or (None, None))) for f in fields(Plan)
                if f.metadata["choices"] is not None or f.metadata["bounds"] is not None)


def _is_file(text: str) -> bool:
    """Whether ``text`` names a file (False for a name the system cannot look up: too long, a NUL)."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):
        return False


def plan_from_json(data: Any, where: str) -> Plan:
    """The plan in parsed JSON ``data``: a plan, the output of ``partita plan --json`` (its
    best plan) or of ``partita estimate --json`` (its plan)."""
    if isinstance(data, dict) and data.get("plans") == []:
        raise PartitaError(f"{where} holds an empty list of plans; pass a file with at least one")
    if isinstance(data, dict) and isinstance(data.get("plans"), list) and data["plans"]:
        data = data["plans"][0]  # the output of `partita plan --json`: its best plan
    if isinstance(data, dict) and "plan" in data and isinstance(data["plan"], dict):
        data = data["plan"]  # an estimate (`partita estimate --json`)
    if not isinstance(data, dict):
        raise PartitaError(f"{where} must hold a JSON object")
    return Plan.from_dict(data, where)


def plan_from_fields(data: dict[str, Any], world_size: int | None = None, where: str = "plan",
                     world_name: str = "the world size") -> Plan:
    """A plan from some of its fields (strings as in ``tp=2``, or typed values): the one place
    that fills what is not given, for plan strings (:meth:`Plan.parse`) and flags alike.

    Every given field is checked first (:func:`parse_field`: one line naming the field and
    its range). dp fills ``world_size`` (named ``world_name`` in the error) over tp*pp*cp;
    gbs defaults to dp*mbs*pp, enough micro-batches to fill the pipeline; sp and the
    schedule follow tp and vpp (:meth:`Plan.from_dict`)."""
    known = {f.name for f in fields(Plan)}
    typed = {k: parse_field(k, v, where) if k in known else v for k, v in data.items()}
    if "dp" not in typed and world_size:
        other = typed.get("tp", 1) * typed.get("pp", 1) * typed.get("cp", 1)
        if world_size % other:
            raise PartitaError(f"{where}: tp*pp*cp = {other} does not divide {world_name} {world_size}")
        typed["dp"] = world_size // other
    if "gbs" not in typed:
        typed["gbs"] = typed.get("dp", 1) * typed.get("mbs", 1) * typed.get("pp", 1)
    return Plan.from_dict(typed, where)


def _number_text(n: int) -> str:
    """``16,777,216`` but ``1024``: thousands separated from five digits on."""
    return f"{n:,}" if abs(n) >= 10_000 else str(n)


def _choices_text(choices: tuple) -> str:
    """``0, 1, 2 or 3``, ``fp32 or bf16``, ``one of none, selective, full``."""
    names = [str(c) for c in choices]
    if len(names) == 2 or all(isinstance(c, int) for c in choices):
        return ", ".join(names[:-1]) + " or " + names[-1]
    return "one of " + ", ".join(names)


def field_meta(name: str) -> Any:
    """The metadata of the plan field ``name`` (:func:`_flag`)."""
    return _FIELDS[name].metadata


def flag_name(name: str) -> str:
    """The command-line flag of plan field ``name``: ``--global-batch`` for gbs, ``--seq-len``."""
    return field_meta(name)["flag"] or "--" + name.replace("_", "-")


def flag_dest(name: str) -> str:
    """Where argparse (or a config dataclass) keeps field ``name``'s flag: ``global_batch`` for gbs."""
    return flag_name(name)[2:].replace("-", "_")


def plan_fields_of(values: Any, names: Any = None) -> dict[str, Any]:
    """``{field: value}`` of the plan flags set (not None) in ``values``, an object whose
    attributes are named as the flags are (:func:`flag_dest`: an argparse namespace, the
    train launcher's ``LaunchConfig``), over ``names`` (default: every plan field). The
    launcher's --global-batch / --seq-len / --mbs become plan fields through it."""
    out = {}
    for name in names if names is not None else _FIELDS:
        value = getattr(values, flag_dest(name), None)
        if value is not None:
            out[name] = value
    return out


def field_problem(name: str, value: Any) -> str | None:
    """What is wrong with the typed ``value`` of field ``name`` by itself ("must be from 1 to
    16,777,216, got 0"), or None: the one check of each field's allowed values and bounds,
    shared by :func:`validate`, plan strings and the command-line flags."""
    meta = field_meta(name)
    if meta["choices"] is not None and value not in meta["choices"]:
        return f"must be {_choices_text(meta['choices'])}, got {value!r}"
    bounds = meta["bounds"]
    if bounds is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"must be {'an integer' if _FIELDS[name].type == 'int' else 'a number'}, got {value!r}"
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        return (meta["bounds_text"] or f"must be from {_number_text(bounds[0])} to {_number_text(bounds[1])}") \
            + f", got {value}"
    if name == "layer_split" and value and not all(-1 < n <= MAX_PLAN_SIZE for n in value):
        return f"entries must be from 0 to {MAX_PLAN_SIZE:,}, got {list(value)}"
    if name == "recompute_modules" and value:
        unknown = [m for m in str(value).split(",") if m not in RECOMPUTE_MODULES]
        if unknown or not isinstance(value, str):
            return (f"must be comma-separated modules among {', '.join(RECOMPUTE_MODULES)} (Megatron-Core "
                    f"transformer_config.py), got {', '.join(repr(m) for m in unknown) or repr(value)}")
    return None


def canonical_modules(value: Any) -> str:
    """``recompute_modules`` as one canonical string: a comma-separated string or a list (a
    plan file's JSON list, the Python API) with blanks dropped, case and repeats folded and the
    known modules in :data:`RECOMPUTE_MODULES` order (unknown names after them, sorted, for
    :func:`field_problem` to name), so that "mlp,mlp" and "mlp", or "layernorm,mlp" and
    "mlp,layernorm", are one plan (Megatron recomputes a set: transformer_config.py checks
    membership only). ``ValueError`` for anything but text or a list of text."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        if not all(isinstance(m, str) for m in value):
            raise ValueError(f"must be a list of module names, got {value!r}")
        value = ",".join(value)
    if not isinstance(value, str):
        raise ValueError(f"must be comma-separated module names, got {value!r}")
    names = {m.strip().lower() for m in value.replace(" ", ",").split(",")} - {""}
    return ",".join([m for m in RECOMPUTE_MODULES if m in names] + sorted(names - set(RECOMPUTE_MODULES)))


def field_value(name: str, value: Any) -> Any:
    """``value`` (text or JSON) as field ``name``'s type, checked by :func:`field_problem`;
    a ``ValueError`` whose message does not name the field (the caller does: "plan: tp ...",
    "argument --tp: ...")."""
    typed = _typed(name, value)
    problem = field_problem(name, typed)
    if problem:
        raise ValueError(problem)
    return typed


def parse_field(name: str, value: Any, where: str = "plan") -> Any:
    """:func:`field_value` with a one-line :class:`PartitaError` naming ``where`` and the field."""
    try:
        return field_value(name, value)
    except ValueError as e:
        raise PartitaError(f"{where}: {name} {e}") from None


_BOOL = {"true": True, "1": True, "yes": True, "on": True, "y": True,
         "false": False, "0": False, "no": False, "off": False, "n": False}


def _coerce(name: str, value: Any, where: str) -> Any:
    """Convert a JSON or key=value string value to the field's type, with a clear error."""
    try:
        return _typed(name, value)
    except ValueError as e:
        raise PartitaError(f"{where}: {name} {e}") from None


def _typed(name: str, value: Any) -> Any:
    """``value`` as field ``name``'s type (``ValueError`` saying what it must be); string
    values lower-cased, with the schedule and recompute short names expanded."""
    kind = _FIELDS[name].type
    if name == "recompute_modules":
        modules = canonical_modules(value)
        if not modules and value not in (None, "", [], ()):  # ",," would silently mean "no module list"
            raise ValueError(f"names no module (among {', '.join(RECOMPUTE_MODULES)}), got {value!r}")
        return modules
    if name == "layer_split":
        if value in (None, "", "none"):
            return None
        if isinstance(value, str):
            value = value.replace("/", " ").replace(":", " ").replace(",", " ").split()
        try:
            if any(isinstance(v, (bool, float)) for v in value):  # int(1.5) would truncate silently
                raise ValueError(value)
            return tuple(int(v) for v in value)
        except (TypeError, ValueError):
            raise ValueError(f"must be a list of integers, got {value!r}") from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if str(value).lower() in _BOOL:
            return _BOOL[str(value).lower()]
        raise ValueError(f"must be true or false, got {value!r}")
    if kind == "float":
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"must be a number, got {value!r}") from None
        bounded = field_meta(name)["bounds"] is not None  # a field with bounds says its own range
        if isinstance(value, bool) or not math.isfinite(number) or (number <= 0 and not bounded):
            raise ValueError(f"must be {'a' if bounded else 'a positive'} number, got {value!r}")
        return number
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError(f"must be an integer, got {value!r}")
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"must be an integer, got {value!r}") from None
        if str(number) != str(value).strip() and not isinstance(value, int):
            raise ValueError(f"must be an integer, got {value!r}")
        return number
    text = str(value).lower()
    text = {"1f1b-interleaved": "interleaved-1f1b", "interleaved": "interleaved-1f1b", "zb": "zero-bubble",
            "zbv": "zero-bubble", "sel": "selective",
            "dualpipe-v": "dualpipev", "dualpipe_v": "dualpipev"}.get(text, text)
    return text


def validate(plan: Plan, model: Any = None, world_size: int | None = None) -> list[str]:
    """Every violated constraint of ``plan``, one line each (empty list: valid).

    This is the only place plan constraints are written down; the search, the
    estimator and the runtime all call it.
    """
    errs = _field_problems(plan)
    if errs:
        return errs  # the checks below combine fields (and divide by them)
    if plan.recompute_layers and plan.recompute != "full":
        errs.append(f"recompute_layers={plan.recompute_layers} needs recompute=full (it recomputes that many whole "
                    f"layers per stage), got recompute={plan.recompute}")
    if plan.dp_shard and plan.dp % plan.dp_shard:
        errs.append(f"dp_shard must be 0 (all of dp) or a divisor of dp={plan.dp}, got {plan.dp_shard}")
    elif 0 < plan.dp_shard < plan.dp and plan.zero < 1:
        errs.append(f"dp_shard={plan.dp_shard} < dp (HSDP) needs zero 1, 2 or 3 (something to shard), got zero 0")
    errs += _validate_compression(plan) + _validate_weight_storage(plan)
    if world_size is not None and plan.world_size != world_size:
        errs.append(f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.world_size} "
                    f"must equal the device count {world_size}")
    if plan.gbs % (plan.dp * plan.mbs):
        errs.append(f"global batch {plan.gbs} must be a multiple of dp*mbs = {plan.dp}*{plan.mbs} = {plan.dp * plan.mbs}")
    if plan.vpp > 1 and plan.pp == 1:
        errs.append(f"vpp={plan.vpp} needs pp > 1 (virtual stages interleave a pipeline)")
    if model is None and plan.layer_split and len(plan.layer_split) != plan.pp * plan.vpp:  # with a model: below
        errs.append(f"layer_split has {len(plan.layer_split)} entries, needs pp*vpp = {plan.pp * plan.vpp}")
    if plan.schedule == "dualpipev":
        errs += _validate_dualpipev(plan)
    elif plan.vpp > 1 and plan.schedule not in ("interleaved-1f1b", "zero-bubble"):
        errs.append(f"vpp={plan.vpp} needs schedule interleaved-1f1b, zero-bubble or dualpipev (vpp 2), "
                    f"not {plan.schedule}")
    if plan.schedule == "interleaved-1f1b" and plan.vpp > 1 and plan.gbs % (plan.dp * plan.mbs) == 0 \
            and plan.grad_accum % plan.pp:
        errs.append(f"interleaved 1F1B needs the micro-batch count ({plan.grad_accum}) to be a multiple of pp={plan.pp}")
    if plan.cp > 1 and plan.seq_len % (2 * plan.cp):
        errs.append(f"seq_len {plan.seq_len} must be divisible by 2*cp = {2 * plan.cp} (load-balanced causal context parallel)")
    if plan.sample_len > plan.seq_len:
        errs.append(f"sample_len {plan.sample_len} must be at most seq_len {plan.seq_len} (packed samples fit in their "
                    "sequence; 0: one sample per sequence)")
    errs += _validate_ep(plan)
    if model is not None:
        errs += _validate_against_model(plan, model)
    return errs


def _validate_dualpipev(plan: Plan) -> list[str]:
    """DualPipeV's constraints, as torch's ``ScheduleDualPipeV.__init__`` (torch 2.13,
    torch/distributed/pipelining/schedules.py) checks them: exactly 2 stages per rank ("ZBV
    requires exactly 2 stages per rank") and at least as many micro-batches as stages
    (``n_microbatches >= 2 pp``); a V needs two ranks to turn at. torch asks for no even
    micro-batch count (its order covers odd ones), so neither do we."""
    errs = []
    if plan.pp < 2:
        errs.append(f"schedule dualpipev needs pp >= 2 (two chunks per rank in a V over the pipeline), got pp={plan.pp}")
    elif plan.vpp != 2:
        errs.append(f"schedule dualpipev needs vpp=2 (chunks r and 2*pp-1-r on rank r), got vpp={plan.vpp}")
    if plan.gbs % (plan.dp * plan.mbs) == 0 and plan.grad_accum < 2 * plan.pp:
        errs.append(f"schedule dualpipev needs at least 2*pp = {2 * plan.pp} micro-batches (torch's ScheduleDualPipeV), "
                    f"the plan has {plan.grad_accum}")
    return errs


def chunk_ranks(pp: int, vpp: int, schedule: str) -> tuple[int, ...]:
    """Pipeline rank of each of the ``pp * vpp`` virtual stages (model chunks), in layer
    order: ``j mod pp`` (Megatron's interleaving), or with ``dualpipev`` the V of torch's
    ``generate_stage_to_rank_mapping(pp, 2 pp, style="v")``: chunk ``j`` on rank ``j`` for
    ``j < pp``, else on rank ``2 pp - 1 - j`` (rank 0 holds the first and the last chunk)."""
    if schedule == "dualpipev" and vpp == 2:
        return tuple(j if j < pp else 2 * pp - 1 - j for j in range(2 * pp))
    return tuple(j % pp for j in range(pp * vpp))


def _field_problems(plan: Plan) -> list[str]:
    """Each field by itself against its metadata (:func:`field_problem` words the line);
    inlined over :data:`_CHECKS` because the search validates every candidate."""
    values = plan.__dict__
    try:
        errs = [f"{name} {field_problem(name, values[name])}" for name, choices, low, high in _CHECKS
                if ((values[name] not in choices) if choices is not None else not low <= values[name] <= high)]
    except TypeError:  # a value of another type (Plan(tp="2") from Python): the slow path words it
        errs = [f"{name} {field_problem(name, values[name])}" for name, *_ in _CHECKS
                if field_problem(name, values[name])]
    if plan.layer_split and field_problem("layer_split", plan.layer_split):
        errs.append(f"layer_split {field_problem('layer_split', plan.layer_split)}")
    if plan.recompute_modules and field_problem("recompute_modules", plan.recompute_modules):
        errs.append(f"recompute_modules {field_problem('recompute_modules', plan.recompute_modules)}")
    return errs


def _validate_compression(plan: Plan) -> list[str]:
    """The communication knobs (issue 17) that combine with other fields, one line each."""
    errs: list[str] = []
    if plan.grad_compression == "powersgd":
        if plan.zero != 0:
            errs.append(f"grad_compression=powersgd needs zero 0 (it all-reduces low-rank factors; ZeRO {plan.zero} "
                        "reduce-scatters gradient shards, which cannot carry them)")
        if plan.grad_dtype == "bf16":
            errs.append("grad_compression=powersgd already compresses the gradients; use grad_dtype fp32 with it")
    return errs


def _validate_weight_storage(plan: Plan) -> list[str]:
    """The weight-storage knobs with what the frameworks accept them with: Megatron asserts
    ``--fp8-param-gather only supported with distributed optimizer, torch fsdp2, megatron fsdp``
    (megatron/training/arguments.py) and TE's fp8 params need fp8 training; MindSpeed's
    ``--reuse-fp32-param`` depends on ``--bf16`` and is incompatible with ZeRO-3
    (mindspeed/features_manager/memory/reuse_fp32_param.py)."""
    errs: list[str] = []
    if plan.fp8_param_gather and (plan.dtype != "fp8" or plan.zero < 1):
        errs.append(f"fp8_param_gather needs dtype fp8 and zero 1-3 (Megatron's distributed optimizer or FSDP), "
                    f"got dtype {plan.dtype}, zero {plan.zero}")
    if plan.reuse_fp32_param and (plan.dtype not in ("bf16", "fp8") or plan.zero > 2):
        errs.append(f"reuse_fp32_param needs dtype bf16 (or fp8 over bf16) and zero 0-2 (MindSpeed refuses it with "
                    f"fp16 and ZeRO-3), got dtype {plan.dtype}, zero {plan.zero}")
    if plan.framework in ("megatron", "mindspeed") and plan.zero == 0 and \
            (plan.optimizer_offload or plan.moment_dtype != "fp32"):
        what = ", ".join(f for f, on in ((f"optimizer_offload={plan.optimizer_offload:g}", plan.optimizer_offload),
                                         (f"moment_dtype={plan.moment_dtype}", plan.moment_dtype != "fp32")) if on)
        errs.append(f"{what} under framework {plan.framework} needs zero 1-3: Megatron raises "
                    "'--use-precision-aware-optimizer only supported with distributed optimizer' "
                    "(megatron/core/optimizer/__init__.py), which zero 0 does not run")
    if plan.recompute_modules and plan.recompute != "selective":  # the names: field_problem
        errs.append(f"recompute_modules {plan.recompute_modules!r} needs recompute selective (Megatron's "
                    f"--recompute-modules go with --recompute-granularity selective), got recompute {plan.recompute}")
    return errs


def _validate_ep(plan: Plan) -> list[str]:
    """Expert parallel is carved out of dp x cp, or folded out of tp x dp x cp (module
    docstring, ``ep``); with expert tensor parallel the expert grid ``etp x ep x edp`` must
    tile the stage's ``tp x cp x dp`` ranks (Megatron-Core raises when ``etp*ep*pp`` does
    not divide the world size, megatron/core/parallel_state.py); with HSDP the experts'
    states are sharded over the shard group's ``dp_shard x cp x tp / (ep*etp)`` ranks
    (torchtitan's ``efsdp``), which must be whole."""
    if plan.ep <= 1 and plan.etp <= 1:
        return []
    stage = plan.tp * plan.dp * plan.cp
    if stage % plan.ep:
        return [f"ep={plan.ep} must divide tp*dp*cp = {plan.tp}*{plan.dp}*{plan.cp} = {stage} "
                "(expert parallel is carved out of data x context parallel, or folded out of tensor x data x context "
                "parallel)"]
    if (stage // plan.ep) % plan.etp:
        return [f"etp={plan.etp} must divide tp*cp*dp/ep = {stage}/{plan.ep} = {stage // plan.ep} (MoE parallel "
                "folding: the expert grid etp x ep x edp tiles tp x cp x dp)"]
    if 0 < plan.dp_shard < plan.dp and (plan.dp_shard * plan.cp * plan.tp) % (plan.ep * plan.etp):
        return [f"ep*etp={plan.ep}*{plan.etp} must divide dp_shard*cp*tp = {plan.dp_shard}*{plan.cp}*{plan.tp} with "
                "HSDP (the experts' states are sharded within the shard group)"]
    return []


def expert_dp(plan: Plan) -> int:
    """The expert data-parallel size ``edp = tp*cp*dp / (ep*etp)`` (module docstring, ``etp``)."""
    return max(1, plan.tp * plan.cp * plan.dp // (plan.ep * plan.etp))


def ep_folded(plan: Plan) -> bool:
    """Whether the plan's ep group reaches into tp (ep does not divide dp x cp): MoE
    parallel folding, see the module docstring."""
    return plan.ep > 1 and (plan.dp * plan.cp) % plan.ep != 0


def _validate_against_model(plan: Plan, model: Any) -> list[str]:
    errs: list[str] = []
    if model.heads % plan.tp:
        errs.append(f"attention heads ({model.heads}) must be divisible by tp={plan.tp}")
    if not model.mla and model.kv_heads % plan.tp:
        errs.append(f"KV heads ({model.kv_heads}) must be divisible by tp={plan.tp} (Megatron-LM asserts it; "
                    "replicating KV heads over tp is not modelled); use a tp that divides them")
    if model.ffn_hidden % plan.tp and model.dense_layers:
        errs.append(f"FFN size ({model.ffn_hidden}) must be divisible by tp={plan.tp}")
    chunks = plan.pp * plan.vpp
    if plan.layer_split:
        if len(plan.layer_split) != chunks:
            errs.append(f"layer_split has {len(plan.layer_split)} entries, needs pp*vpp = {chunks}")
        elif sum(plan.layer_split) != model.layers:
            errs.append(f"layer_split sums to {sum(plan.layer_split)}, the model has {model.layers} layers")
        elif min(plan.layer_split) < 0:  # an empty stage is allowed, as in Megatron's layouts ("E||t|L",
            # docs/user-guide/features/pipeline_parallel_layout.md; DeepSeek-V3's MTP-only stage)
            errs.append("every pipeline stage in layer_split needs zero or more layers")
    elif model.layers % chunks and automatic_split(model.layers, chunks) is None:
        errs.append(f"{model.layers} layers cannot be split over pp*vpp = {plan.pp}*{plan.vpp} = {chunks} stages "
                    f"with at least one layer in every middle stage; use fewer stages")
    if plan.recompute_layers > 0 and not errs:
        largest = max(plan.stage_layers(model.layers))
        if plan.recompute_layers > largest:
            errs.append(f"recompute_layers={plan.recompute_layers} exceeds the largest pipeline stage/chunk "
                        f"({largest} layers); use 1 to {largest}, or 0 for every layer")
    modules = set(plan.recompute_modules.split(",")) if isinstance(plan.recompute_modules, str) else set()
    if "moe_act" in modules and not model.moe:  # Megatron-Core: moe_act needs --moe-grouped-gemm, a MoE model's
        errs.append(f"recompute_modules moe_act needs a mixture-of-experts model (Megatron-Core transformer_config.py "
                    f"accepts it only with --moe-grouped-gemm); {model.name} is dense")
    if "mla_up_proj" in modules and not model.mla:
        errs.append(f"recompute_modules mla_up_proj needs multi-latent attention (Megatron-Core transformer_config.py: "
                    f"--multi-latent-attention); {model.name} has none")
    if plan.ep > 1:
        if not model.moe:
            errs.append(f"ep={plan.ep} needs a mixture-of-experts model; {model.name} is dense")
        elif model.moe.num_experts % plan.ep:
            errs.append(f"routed experts ({model.moe.num_experts}) must be divisible by ep={plan.ep}")
    if plan.etp > 1:
        if not model.moe:
            errs.append(f"etp={plan.etp} needs a mixture-of-experts model; {model.name} is dense (use tp)")
        elif model.moe.expert_ffn_hidden % plan.etp:
            errs.append(f"expert FFN size ({model.moe.expert_ffn_hidden}) must be divisible by etp={plan.etp} "
                        "(expert tensor parallel splits each expert's FFN)")
    return errs


def check(plan: Plan, model: Any = None, world_size: int | None = None) -> Plan:
    """Raise a one-line :class:`PartitaError` for the first violated constraint(s)."""
    errs = validate(plan, model, world_size)
    if errs:
        raise PartitaError("invalid plan: " + "; ".join(errs))
    return plan


# ---------------------------------------------------------------- rank layout
def axis_sizes(plan: Plan) -> dict[str, int]:
    return {"pp": plan.pp, "dp": plan.dp, "cp": plan.cp, "tp": plan.tp}


def axis_stride(plan: Plan, axis: str) -> int:
    """Distance in global rank between neighbours along ``axis`` (row-major over MESH_AXES;
    the expert axes ``etp``, ``ep``, ``edp``: Megatron-Core's expert order ``tp-ep-dp-pp``
    with etp > 1, see the module docstring)."""
    sizes = axis_sizes(plan)
    if axis == "etp":
        return 1
    if axis == "ep":
        if plan.etp > 1:  # expert RankGenerator: ep is the axis right outside etp
            return plan.etp
        # ep groups: consecutive members of the flattened (dp, cp) axes; folded into tp
        # (ep_folded), ep consecutive ranks - Megatron-Core's expert rank order with etp 1
        return 1 if ep_folded(plan) else plan.tp
    if axis == "edp":
        return plan.etp * plan.ep
    if axis == "dp_cp":
        return plan.tp
    stride = 1
    for name in reversed(MESH_AXES):
        if name == axis:
            return stride
        stride *= sizes[name]
    raise ValueError(f"unknown mesh axis {axis!r}")


def axis_size(plan: Plan, axis: str) -> int:
    if axis == "ep":
        return plan.ep
    if axis == "etp":
        return plan.etp
    if axis == "edp":
        return expert_dp(plan)
    if axis == "dp_cp":
        return plan.dp * plan.cp
    return axis_sizes(plan)[axis]


def axis_ranks(plan: Plan, axis: str, rank: int = 0) -> list[int]:
    """Global ranks of the ``axis`` group that contains ``rank``."""
    stride, size = axis_stride(plan, axis), axis_size(plan, axis)
    block = stride * size
    base = (rank // block) * block + rank % stride
    return [base + i * stride for i in range(size)]


def axis_index(plan: Plan, axis: str, rank: int) -> int:
    """This rank's coordinate along ``axis`` (its position in its ``axis`` group)."""
    return axis_ranks(plan, axis, rank).index(rank)


def group_span(plan: Plan, axis: str, devices_per_node: int) -> tuple[int, int]:
    return _group_span(plan.pp, plan.dp, plan.cp, plan.tp, plan.ep, axis, devices_per_node, plan.etp)


@lru_cache(maxsize=65536)
def _group_span(pp: int, dp: int, cp: int, tp: int, ep: int, axis: str, devices_per_node: int,
                etp: int = 1) -> tuple[int, int]:
    """(members per node, nodes) of an ``axis`` group under the row-major layout.

    A group whose members are ``stride`` apart stays inside a node while
    ``stride * size <= devices_per_node``; once ``stride >= devices_per_node`` every member
    sits on its own node.
    """
    ranks = axis_ranks(Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp), axis)
    nodes = len({r // devices_per_node for r in ranks})
    return len(ranks) // nodes, nodes


def balanced_split(layers: int, chunks: int) -> tuple[int, ...]:
    """Spread ``layers`` over ``chunks`` virtual stages, counting the embedding and the
    output layer as one layer each on the first and last stage (Megatron's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``)."""
    total = layers + 2
    base, extra = divmod(total, chunks)
    sizes = [base + (1 if i < extra else 0) for i in range(chunks)]
    sizes = sizes[extra:] + sizes[:extra] if extra else sizes  # larger stages in the middle
    sizes[0] -= 1
    sizes[-1] -= 1
    if min(sizes) < 0:
        raise PartitaError(f"cannot split {layers} layers over {chunks} pipeline stages")
    return tuple(sizes)


def automatic_split(layers: int, chunks: int) -> tuple[int, ...] | None:
    """The layer split used when ``layers`` does not divide into ``chunks`` = pp*vpp
    equal virtual stages and the plan gives none (None when it divides, or when no split
    leaves every middle stage a layer).

    Min-max balanced with the embedding on the first stage and the output layer + loss on
    the last each counted as one layer - Megatron-LM's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``
    semantics (megatron/core/transformer/transformer_block.py) - so the end stages get a
    layer less than the middle ones where the count leaves a remainder. Export writes it
    as the exact per-stage layout (Megatron ``--pipeline-model-parallel-layout``;
    torchtitan ``pipeline_parallel_first/last_stage_less_layers``). An explicit
    ``layer_split`` always wins; the search picks its own (it measures the output
    layer's cost)."""
    if chunks <= 1 or layers % chunks == 0:
        return None
    try:
        split = balanced_split(layers, chunks)
    except PartitaError:
        return None
    return split if min(split[1:-1] or (1,)) >= 1 else None


def normalise(plan: Plan, model: Any = None) -> Plan:
    """Drop settings that do nothing (sp without tp, vpp schedule names without vpp); with
    a model, write the automatic layer split (:func:`automatic_split`) into a plan whose
    layers do not divide into pp*vpp stages, so that its JSON and its exports name it."""
    changes: dict[str, Any] = {}
    if model is not None and not plan.layer_split and plan.pp * plan.vpp > 1 \
            and model.layers % (plan.pp * plan.vpp):
        split = automatic_split(model.layers, plan.pp * plan.vpp)
        if split:
            changes["layer_split"] = split
    if plan.tp == 1 and plan.sp:
        changes["sp"] = False
    if plan.pp == 1 and plan.schedule != "1f1b":
        changes["schedule"] = "1f1b"
    return replace(plan, **changes) if changes else plan

