"""LoRA fine-tuning in the runtime with PEFT's own LoRA layers (``peft.tuners.lora.Linear``).

Injection: :func:`inject_lora` calls ``peft.inject_adapter_in_model`` on the (meta) model
before the plan is applied - the model keeps its own class and parameter names, each
target linear becomes PEFT's ``lora.Linear`` holding ``base_layer`` (frozen) and
``lora_A.default`` / ``lora_B.default`` (trained); every other parameter is frozen.
Targets (plan ``lora_targets``): attention = q/k/v/o projections, qkv = q/k/v, mlp = gate/up/down,
all-linear = both (PEFT's own "all-linear" on these models: every linear but the head).

Values: a meta model's shards are filled by :class:`LoraSource` - the base weights from
the model's own source under their un-injected names (its safetensors, or the seed's
per-parameter initialisation, so the frozen base is bit-identical to the model without
LoRA), ``lora_B`` zeros and ``lora_A`` PEFT's default (``kaiming_uniform_(a=sqrt(5))``,
i.e. U(-1/sqrt(in), 1/sqrt(in))) drawn from a generator per parameter name
(:func:`partita.models.init.param_seed`), so every plan starts from the same adapter;
with ``--adapter DIR`` they are read from PEFT's ``adapter_model.safetensors``.

Parallelism:

* data parallel / ZeRO-1: only trainable parameters are reduced and stepped (DDP and
  :class:`~.data_parallel.GradientSync` skip ``requires_grad=False``);
* ZeRO-2/3 (FSDP2): a block's frozen and trainable parameters share one FSDP unit - FSDP2
  all-gathers both and reduce-scatters only the gradients that exist;
* tensor parallel: Megatron / NeMo's split of adapters (NeMo ``ParallelLinearAdapter``):
  on a column-parallel base, ``lora_A`` is replicated (whole input) and ``lora_B`` is
  column-parallel like the base (its output shard adds to the base's); on a row-parallel
  base, ``lora_A`` is row-parallel (input shard, output all-reduced - or reduce-scattered
  on the sequence with sequence parallel) and ``lora_B`` replicated (sequence-parallel
  with SP: its weight gradient is summed over the tp ranks). The adapters' activations
  therefore cost r/out of the base's, and the one extra collective is the row side's
  all-reduce of an r-wide tensor.
* pipeline parallel (interleaved too): each stage is a copy of the injected model keeping
  its layers (names unchanged), so a stage holds and steps its own layers' adapters;
  saving gathers every stage's adapters over the pipeline group (:func:`_gather_stages`);
* context parallel (reference models): the adapters are per-token linears, so cp changes
  nothing for them - each cp rank's adapter gradients cover its tokens and are averaged
  over dp x cp like every gradient. Packed SFT rows do not run with cp (parallelize.PACKED_CP);
* expert parallel, and MoE models under any plan: adapters on attention only
  (:func:`lora_problem`). PEFT's ``target_modules`` wraps ``nn.Linear`` modules; the routed
  experts are fused 3-D parameters (HF ``Qwen2MoeExperts`` / ``MixtralExperts``, the
  reference ``GroupedExperts``), which
  it cannot reach, so "mlp" would adapt the shared expert and the dense layers only while
  the planner counts every routed expert's adapters (cost/finetune.py). The frozen experts
  are sharded over ep as without LoRA.

Saving (:func:`save_adapter`): the gathered adapters in PEFT's format -
``adapter_config.json`` (``LoraConfig.save_pretrained``) and ``adapter_model.safetensors``
with PEFT's key names (``base_model.model.<module>.lora_A.weight``), which
``peft.PeftModel.from_pretrained`` loads; :func:`save_merged` writes the merged weights
``W + (alpha / r) B A`` as a plain Hugging Face directory.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from ..errors import PartitaError

ADAPTER = "default"
TARGETS = {
    "hf": {"attention": ["q_proj", "k_proj", "v_proj", "o_proj"], "qkv": ["q_proj", "k_proj", "v_proj"],
           "mlp": ["gate_proj", "up_proj", "down_proj"]},
    "reference": {"attention": ["wq", "wk", "wv", "wo"], "qkv": ["wq", "wk", "wv"], "mlp": ["w1", "w2", "w3"]},
}
PEFT_PREFIX = "base_model.model."


def _peft():
    try:
        import peft
    except ImportError:
        raise PartitaError("--finetune lora needs PEFT: pip install 'partita[finetune]'") from None
    return peft


def target_names(model: nn.Module, targets: str) -> list[str]:
    """The module names PEFT targets for ``targets`` on this model's family."""
    from ..models.registry import family_of
    table = TARGETS[family_of(model).name]
    return table["attention"] + table["mlp"] if targets == "all-linear" else list(table[targets])


def lora_config(model: nn.Module, plan):
    """PEFT's ``LoraConfig`` of the plan (no bias; the plan's dropout, 0 by default so that runs are
    exact against one process)."""
    return _peft().LoraConfig(r=plan.lora_rank, lora_alpha=plan.lora_alpha, lora_dropout=plan.lora_dropout,
                              bias="none", target_modules=target_names(model, plan.lora_targets))


#: the one LoRA restriction of this runtime (module docstring, "expert parallel")
MOE_TARGETS = ("--finetune lora on an MoE model adapts attention only in this runtime (PEFT's target_modules cannot "
               "reach the fused routed experts); pass --lora-targets attention")


#: the other: PEFT's dropout on a replicated adapter input would draw a different mask on each
#: tensor-parallel rank of the same tokens
TP_DROPOUT = ("--lora-dropout > 0 with tp > 1 is not run by this runtime (each tensor-parallel rank would drop the "
              "replicated adapter input with its own mask); use --lora-dropout 0 or tp=1 (the estimate prices it)")


def lora_problem(plan, model: nn.Module | None = None) -> str | None:
    """Why this runtime cannot run LoRA under ``plan`` on ``model`` (None: it can)."""
    if plan.finetune == "lora" and plan.lora_dropout > 0 and plan.tp > 1:
        return TP_DROPOUT
    if plan.finetune != "lora" or plan.lora_targets in ("attention", "qkv") or model is None:
        return None
    return MOE_TARGETS if is_moe(model) else None


def is_moe(model: nn.Module) -> bool:
    """Whether ``model`` has routed experts (the reference ``MoE``, HF's fused expert modules)."""
    from ..models.llama import MoE
    from .hf_moe import FUSED_EXPERTS
    return any(isinstance(m, MoE) or type(m).__name__ in FUSED_EXPERTS for m in model.modules())


def has_lora(model: nn.Module) -> bool:
    return any(".lora_A." in n for n, _ in model.named_parameters())


def inject_lora(model: nn.Module, plan, adapter_dir: str | None = None) -> nn.Module:
    """PEFT's LoRA layers into ``model`` (in place), base frozen; a meta model's values come
    from :class:`LoraSource` when the plan is applied. ``adapter_dir``: start from a saved
    PEFT adapter, whose rank, alpha and targets must be the plan's."""
    peft = _peft()
    config = lora_config(model, plan)
    if adapter_dir:
        _check_adapter(adapter_dir, config)
    meta = any(p.device.type == "meta" for p in model.parameters())
    base_source = None
    if meta:
        from .materialize import init_source
        base_source = init_source(model)
    try:
        peft.inject_adapter_in_model(config, model)
    except ValueError as e:
        raise PartitaError(f"--finetune lora: {str(e).splitlines()[0][:200]} (--lora-targets {plan.lora_targets})") \
            from None
    freeze_base([model])
    seed = int(getattr(model, "partita_seed", 0))
    source = LoraSource(base_source, seed, adapter_dir)
    if meta:
        model.partita_init = source
    else:
        source.fill_adapters(model)
    model.partita_lora = config
    return model


def freeze_base(modules: list[nn.Module]) -> None:
    """Only the adapters train. Called after injection and again after tensor parallel:
    ``parallelize_module``'s styles (SequenceParallel's replicated norms, the column/row
    splits) register new Parameters, which default to ``requires_grad=True``."""
    for module in modules:
        for name, p in module.named_parameters():
            p.requires_grad_(".lora_A." in name or ".lora_B." in name)


def _check_adapter(adapter_dir: str, config) -> None:
    path = Path(adapter_dir)
    try:
        theirs = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError) as e:
        raise PartitaError(f"--adapter {adapter_dir}: not a PEFT adapter directory ({e})") from None
    if not (path / "adapter_model.safetensors").is_file():
        raise PartitaError(f"--adapter {adapter_dir}: no adapter_model.safetensors")
    mine = {"r": config.r, "lora_alpha": config.lora_alpha, "target_modules": sorted(config.target_modules)}
    got = {"r": theirs.get("r"), "lora_alpha": theirs.get("lora_alpha"),
           "target_modules": sorted(theirs.get("target_modules") or [])}
    if got != mine:
        raise PartitaError(f"--adapter {adapter_dir} has r={got['r']}, alpha={got['lora_alpha']}, targets "
                           f"{got['target_modules']}; this run has {mine['r']}, {mine['lora_alpha']}, "
                           f"{mine['target_modules']}: pass --lora-rank/--lora-alpha/--lora-targets to match")


def lora_init(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """The whole adapter ``name``: ``lora_B`` zeros; ``lora_A`` PEFT's
    ``kaiming_uniform_(a=sqrt(5))``: gain sqrt(2/(1+a^2)) = sqrt(1/3), bound =
    gain * sqrt(3/fan_in) = 1/sqrt(fan_in), from a generator of its own."""
    if ".lora_B." in name:
        return torch.zeros(shape)
    from ..models.init import param_seed
    gen = torch.Generator().manual_seed(param_seed(seed, name))
    bound = 1.0 / math.sqrt(shape[1])
    return torch.empty(shape).uniform_(-bound, bound, generator=gen)


def peft_key(name: str) -> str:
    """Our parameter name -> PEFT's file key (prefix added, adapter name dropped)."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")


class LoraSource:
    """Values of a LoRA-injected meta model: the base from its own source, the adapters
    from the seed (:func:`lora_init`) or a PEFT adapter file."""

    def __init__(self, base, seed: int, adapter_dir: str | None):
        self.base, self.seed = base, seed
        self.path = getattr(base, "path", None)  # the worker's "weights already read" check
        self.adapter = None
        if adapter_dir:
            from safetensors import safe_open
            self.adapter = safe_open(str(Path(adapter_dir) / "adapter_model.safetensors"), "pt")

    def full_adapter(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if self.adapter is None:
            return lora_init(name, shape, self.seed)
        key = peft_key(name)
        if key not in self.adapter.keys():
            raise PartitaError(f"--adapter: the adapter file has no tensor {key} (an adapter of another model?)")
        t = self.adapter.get_tensor(key)
        if tuple(t.shape) != tuple(shape):
            raise PartitaError(f"--adapter: {key} has shape {tuple(t.shape)}, this model needs {tuple(shape)}")
        return t.float()

    def read(self, name: str, shape, offset, local) -> torch.Tensor:
        if ".lora_A." in name or ".lora_B." in name:
            full = self.full_adapter(name, tuple(shape))
            return full[tuple(slice(o, o + n) for o, n in zip(offset, local))]
        return self.base.read(name.replace(".base_layer.", "."), shape, offset, local)

    @torch.no_grad()
    def fill_adapters(self, model: nn.Module) -> None:
        """Set the adapters of a model with real storage (not meta)."""
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.copy_(self.full_adapter(name, tuple(p.shape)))


# -- tensor parallel -----------------------------------------------------------------------
def lora_tp_plan(block: nn.Module, plan: dict, sp: bool) -> dict:
    """A block's tensor-parallel plan with PEFT LoRA layers: the base styles move to
    ``<name>.base_layer``, the adapters get the NeMo split (module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)
    out: dict = {}
    for key, style in plan.items():
        try:
            module = block.get_submodule(key)
        except AttributeError:
            module = None
        if module is None or not hasattr(module, "base_layer") or not hasattr(module, "lora_A"):
            out[key] = style
            continue
        out[f"{key}.base_layer"] = style
        a, b = f"{key}.lora_A.{ADAPTER}", f"{key}.lora_B.{ADAPTER}"
        if isinstance(style, ColwiseParallel):
            # A whole on every rank (input made a plain local tensor, gathered if sequence-sharded)
            out[a] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                        use_local_output=True)
            out[b] = ColwiseParallel()
        elif isinstance(style, RowwiseParallel):
            out[a] = RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())
            if sp:
                out[b] = SequenceParallel(use_local_output=True)
        else:
            raise PartitaError(f"--finetune lora: no tensor-parallel split for {type(style).__name__} at {key}")
    return out


# -- saving ----------------------------------------------------------------------------------
def _cores(pm) -> list[nn.Module]:
    return [m.module if isinstance(m, nn.parallel.DistributedDataParallel) else m for m in pm.modules]


def _full(p: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor
    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True).float().contiguous()


def adapter_state(pm) -> dict[str, torch.Tensor]:
    """The whole adapters under PEFT's key names (collective: every rank calls it)."""
    from ..models.hf_weights import _clean
    out = {}
    for module in _cores(pm):
        for name, p in module.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                out[peft_key(_clean(name))] = _full(p)
    return _gather_stages(pm, out)


def _gather_stages(pm, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Under pipeline parallel: every stage's ``state`` (whole tensors, on the CPU) on the
    first rank of each pipeline group, merged (stages hold disjoint names); unchanged
    without pp. The other ranks return their own part (only global rank 0 writes)."""
    group = getattr(pm, "pp_group", None)
    if group is None or dist.get_world_size(group) == 1:
        return state
    first = dist.get_rank(group) == 0
    parts: list | None = [None] * dist.get_world_size(group) if first else None
    dist.gather_object(state, parts, group=group, group_dst=0)
    if not first:
        return state
    return {k: v for part in parts for k, v in part.items()}


def save_adapter(pm, out: str | Path, config, base_name: str | None) -> None:
    """``out/adapter_config.json`` + ``out/adapter_model.safetensors`` (PEFT's format)."""
    from safetensors.torch import save_file
    state = adapter_state(pm)
    if dist.get_rank() == 0:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        config.base_model_name_or_path = base_name
        config.save_pretrained(str(out))
        save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    dist.barrier()


def merged_state(pm, config) -> dict[str, torch.Tensor]:
    """Every weight gathered, the adapters merged: ``W + (alpha / r) B A`` under ``W``'s name."""
    from ..models.hf_weights import _clean
    params = {_clean(n): p for module in _cores(pm) for n, p in module.named_parameters()}
    scale = config.lora_alpha / config.r
    out = {}
    for name, p in params.items():
        if ".lora_A." in name or ".lora_B." in name:
            continue
        w = _full(p)
        if ".base_layer." in name:
            stem = name.rsplit(".base_layer.", 1)[0]
            a, b = _full(params[f"{stem}.lora_A.{ADAPTER}.weight"]), _full(params[f"{stem}.lora_B.{ADAPTER}.weight"])
            w = w + scale * (b @ a)
            name = name.replace(".base_layer.", ".")
        out[name] = w
    return _gather_stages(pm, out)


def save_merged(pm, out: str | Path, hf_config, source: str | None) -> None:
    """The merged model as a Hugging Face directory (``model.safetensors`` + config + tokenizer)."""
    from safetensors.torch import save_file
    from ..models.hf_weights import _write_side_files
    state = merged_state(pm, _config_of(pm))
    if dist.get_rank() == 0:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        if getattr(hf_config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        _write_side_files(out, hf_config, [], 1, source)
    dist.barrier()


def _config_of(pm):
    config = getattr(pm, "lora_config", None)
    if config is None:
        raise PartitaError("--merge: the model has no LoRA adapters (--finetune lora)")
    return config
