"""Deterministic per-parameter initialisation, so that meta-device models can be sharded first
and initialised shard by shard with the same weights under every plan.

Why per parameter: a model built on the meta device is split (pipeline stages), sharded
(tensor/expert parallel, FSDP) and only then given storage; each rank fills only its own
shard. Drawing from one global RNG stream (``torch.manual_seed`` then build) would make the
values depend on which parameters a rank holds and in what order it fills them. Instead
every parameter draws from its own generator, seeded from ``(seed, fully-qualified name)``
(:func:`param_seed`), and a rank generates the *full* parameter and keeps its slice
(:func:`full_init`): at most one full parameter is held transiently, and the gathered
weights are bit-identical to the single-process model built with the same seed
(:func:`init_model_`), whatever the plan. torchtitan takes the same route (meta device,
``to_empty``, ``init_weights`` on the sharded model) but initialises DTensors through the
global RNG; Megatron-LM's ``_initialize_affine_weight_cpu`` is the "full master weight,
then keep my slice" half of this scheme.

The rules (:func:`init_rules`) follow each model family's own initialiser:
* reference models (:mod:`.llama`): normal(0, init_std), residual-branch outputs scaled by
  1/sqrt(2 layers) (GPT-2 / Megatron), norms ones;
* Hugging Face models: ``PreTrainedModel._init_weights`` - Linear/Embedding/fused-expert
  weights normal(0, ``config.initializer_range``), biases zero, norm weights one, the
  embedding's ``padding_idx`` row zero.

:func:`params_on_meta` builds a model with its parameters on the meta device and its buffers
(RoPE tables) real: buffers are small and only the model's own code knows how to compute
them, so they are kept rather than recomputed.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
from typing import Iterator

import torch
from torch import nn

#: a rule: ("normal", std, padding_idx or -1) | ("ones",) | ("zeros",)
Rule = tuple


def param_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed from the run seed and a parameter's fully-qualified name
    (SHA-256: stable across processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def full_init(rule: Rule, name: str, shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The whole parameter ``name`` of ``shape`` for ``seed`` (on the CPU, fp32 drawn, then cast)."""
    kind = rule[0]
    if kind == "ones":
        return torch.ones(shape, dtype=dtype)
    if kind == "zeros":
        return torch.zeros(shape, dtype=dtype)
    gen = torch.Generator().manual_seed(param_seed(seed, name))
    out = torch.empty(shape, dtype=torch.float32).normal_(0.0, float(rule[1]), generator=gen)
    if len(rule) > 2 and rule[2] >= 0:
        out[rule[2]] = 0.0
    return out.to(dtype)


def reference_rule(name: str, p: torch.Tensor, init_std: float, layers: int) -> Rule:
    """Partita's reference models: matrices normal, residual outputs scaled, vectors ones."""
    if p.dim() < 2:
        return ("ones",)
    scale = 1 / math.sqrt(2 * layers) if name.endswith(("wo.weight", "w2.weight", "experts.w2")) else 1.0
    return ("normal", init_std * scale, -1)


def _hf_rule(module: nn.Module, leaf: str, p: torch.Tensor, std: float) -> Rule:
    cls = type(module).__name__
    if "Norm" in cls:
        return ("ones",) if leaf == "weight" else ("zeros",)
    if leaf == "bias":
        return ("zeros",)
    pad = getattr(module, "padding_idx", None) if isinstance(module, nn.Embedding) else None
    return ("normal", std, -1 if pad is None else int(pad))


def init_rules(model: nn.Module) -> dict[str, Rule]:
    """Parameter name (as ``named_parameters`` gives it on the unsplit model) -> rule."""
    rules: dict[str, Rule] = {}
    if not hasattr(model, "cfg"):  # a Hugging Face model (reference models carry a TransformerConfig)
        std = float(getattr(model.config, "initializer_range", 0.02))
        for mod_name, module in model.named_modules():
            for leaf, p in module.named_parameters(recurse=False):
                name = f"{mod_name}.{leaf}" if mod_name else leaf
                rules.setdefault(name, _hf_rule(module, leaf, p, std))
        return {name: rules[name] for name, _ in model.named_parameters()}
    cfg = model.cfg
    return {name: reference_rule(name, p, cfg.init_std, cfg.layers) for name, p in model.named_parameters()}


@torch.no_grad()
def init_model_(model: nn.Module, seed: int) -> nn.Module:
    """Fill every parameter of a single-device model (real storage) from ``seed`` - the
    weights every plan's meta initialisation reproduces shard by shard."""
    for name, rule in init_rules(model).items():
        p = model.get_parameter(name)
        if p.device.type != "meta":
            p.copy_(full_init(rule, name, tuple(p.shape), seed, p.dtype))
    model.partita_seed = seed
    return model


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Parameters registered inside go to the meta device; buffers stay real.

    A module's ``__init__`` creates a parameter's tensor, then registers it; here it is
    replaced by a meta tensor as it is registered (its uninitialised CPU tensor, never
    touched, is freed at once), so initialisers that run afterwards (``reset_parameters``,
    HF's ``post_init``) act on meta tensors and cost nothing."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kwargs = dict(module._parameters[name].__dict__)
            module._parameters[name] = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            module._parameters[name].__dict__.update(kwargs)
    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def is_meta(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` still lives on the meta device."""
    return any(p.device.type == "meta" for p in model.parameters())


def materialize_params(model: nn.Module, device: torch.device) -> nn.Module:
    """Uninitialised storage on ``device`` for every meta parameter of a single-device
    model, tied parameters kept tied (the whole model: for one process, or before a plan)."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            if id(p) not in made:
                made[id(p)] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                                           requires_grad=p.requires_grad)
                made[id(p)].__dict__.update(p.__dict__)
            module._parameters[name] = made[id(p)]
    return model
