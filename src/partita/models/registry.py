"""The one place that turns a model name into a model, and says which family a built model is.

Before this module, eight if-chains (builder, launcher, equivalence checks, the reference
model) each decided what ``--model X`` meant, and they drifted: a config-only Hugging Face
directory trained as ``LlamaForCausalLM`` but was planned as the reference Transformer.
Now :func:`resolve_model` decides the kind of a name once, and its :class:`ModelEntry`
answers everything a caller asks of that name:

========================  ==============================================================
kind                      names
========================  ==============================================================
``hf-tiny``               ``hf-llama``, ``hf-qwen2``, ``hf-mixtral`` (:data:`TINY_HF`): tiny
                          HF models built from a config, no download; with ``checks=True``
                          also the Qwen-MoE ones of the equivalence checks (:data:`TINY_HF_MOE`)
``hf-weights``            a directory with an HF ``config.json`` and ``*.safetensors``: read
                          shard by shard into the parallelized model
``hf-config``             any other directory (an HF ``config.json``, no safetensors): that
                          architecture, initialised from the seed (``pytorch_model.bin``
                          weights: ``from_pretrained``)
``reference``             everything else: the reference models (``tiny-llama``, ``tiny-moe``,
                          ``small-llama``), Partita presets and model files, built as
                          :class:`partita.models.llama.Transformer` from their spec
========================  ==============================================================

A built model's family (:func:`family_of`) answers what the runtime asks of a module
without knowing its class: its blocks, logits, auxiliary loss, vocabulary, planner spec and
the config ``--save-hf`` writes; the runtime dispatches its family-specific transforms
(tensor parallel, pipeline stages, limits) on :attr:`Family.name`.

Importing this module loads no torch: the kind of a name and the planner's spec of presets,
model files and directories are torch-free; building (and the spec of the tiny HF models,
read from their built config) imports torch and transformers inside the functions.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import unknown_name

if TYPE_CHECKING:  # annotations only: importing this module stays torch-free
    import torch
    from torch import nn

    from ..spec.model import ModelSpec

#: tiny HF models of ``partita train`` and the tests: name -> (config class, model class,
#: architecture-specific config fields), built at :data:`partita.models.hf.TINY_BASE`'s size
TINY_HF: dict[str, tuple[str, str, dict]] = {
    "hf-llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "hf-qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "hf-mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}
#: tiny Qwen2-MoE / Qwen3-MoE models for the runtime's equivalence checks only (fused routed
#: experts like Mixtral's, :mod:`partita.runtime.hf_moe`); ``resolve_model(name, checks=True)``
TINY_HF_MOE: dict[str, tuple[str, str, dict]] = {
    "hf-qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                     {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                      "shared_expert_intermediate_size": 64}),
    "hf-qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                     {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True}),
}
#: the kinds of name whose models are Hugging Face ``*ForCausalLM`` modules
HF_KINDS = ("hf-tiny", "hf-weights", "hf-config")


def resolve_model(name: str, checks: bool = False) -> ModelEntry:
    """What ``name`` is (see the module docstring), decided once, without torch. An unknown
    name is one line listing the close known names; ``checks``: also the tiny HF MoE models
    of the equivalence checks."""
    tiny = {**TINY_HF, **(TINY_HF_MOE if checks else {})}
    if name in tiny:
        return ModelEntry(name, "hf-tiny", tiny[name])
    from ..inputs import path_exists
    from ..spec.load import preset_names
    path = Path(name)
    if path_exists(path) and path.is_dir():  # path_exists: a name too long to look up is unknown, not an OSError
        return ModelEntry(name, "hf-weights" if _has_safetensors(path) else "hf-config")
    if path.suffix != ".json" and not path_exists(path) and name.lower() not in preset_names():
        raise unknown_name("model", name, [*preset_names(), *tiny])
    return ModelEntry(name, "reference")


def _has_safetensors(path: Path) -> bool:
    """An HF ``config.json`` with ``*.safetensors`` beside it: weights read shard by shard."""
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


@dataclass(frozen=True)
class ModelEntry:
    """A resolved model name: its planner spec, builders, vocabulary, tokenizer and family."""

    name: str
    kind: str  # "hf-tiny" | "hf-weights" | "hf-config" | "reference"
    tiny: tuple[str, str, dict] | None = None  # hf-tiny: (config class, model class, fields)

    @property
    def family(self) -> str:
        """``"hf"`` or ``"reference"``: the :class:`Family` of what :meth:`build` returns."""
        return "hf" if self.kind in HF_KINDS else "reference"

    @property
    def saves_hf(self) -> bool:
        """Whether ``--save-hf`` can write it: every HF model, with or without weights."""
        return self.family == "hf"

    @property
    def source_dir(self) -> str | None:
        """The model's directory (the HF kinds read from disk), for its tokenizer and side files."""
        return str(Path(self.name)) if self.kind in ("hf-weights", "hf-config") else None

    @property
    def weights_dir(self) -> str | None:
        """The directory whose safetensors the ranks read their shards from (None: from the seed)."""
        return self.source_dir if self.kind == "hf-weights" else None

    def tokenizer(self) -> str | None:
        """The model directory's ``tokenizer.json``, if it has one."""
        path = Path(self.source_dir) / "tokenizer.json" if self.source_dir else None
        return str(path) if path is not None and path.is_file() else None

    def spec(self) -> ModelSpec:
        """The planner's view. Presets, model files and directories are read by
        :func:`partita.spec.load.load_model` (no torch); a tiny HF model from its built config."""
        if self.kind == "hf-tiny":
            model = self.build(meta=True)
            return family_of(model).spec_of(model)
        from ..spec.load import load_model
        return load_model(self.name)

    def vocab(self) -> int | None:
        """The vocabulary, for the token-file check (None when it cannot be read cheaply:
        the worker then reports what is wrong with the model)."""
        try:
            return self.spec().vocab
        except Exception:
            return None

    def build(self, seed: int = 0, meta: bool = False) -> nn.Module:
        """The model, identical on every rank for ``seed``. ``meta``: parameters on the meta
        device, for :func:`partita.parallelize` to shard and initialise (or read) shard by shard
        (:mod:`partita.runtime.materialize`); a weights directory ignores ``seed``."""
        if self.kind == "hf-tiny":
            from .hf import build_tiny_hf
            return build_tiny_hf(*self.tiny, seed=seed, meta=meta)
        if self.kind == "hf-weights" and meta:
            from .hf_weights import build_hf_meta
            return build_hf_meta(self.name)
        if self.kind in HF_KINDS:
            from .hf import build_hf_dir
            return build_hf_dir(Path(self.name), seed, meta)
        from .llama import build_model
        return build_model(self.name, seed=seed, device="meta" if meta else "cpu")

    def check_model(self) -> nn.Module:
        """The model the launcher checks a plan against (``runtime_check``) and ``--plan auto``
        plans, before any process starts: exactly what the workers will train, on the meta
        device. A weights directory's safetensors headers (or index) are read here too, so a
        damaged one is one line now rather than a failed worker."""
        if self.kind == "hf-weights":
            from .hf_weights import weight_map
            weight_map(Path(self.name))
        return self.build(meta=True)


def build_named_model(name: str, seed: int = 0) -> nn.Module:
    """The model called ``name`` on the CPU with the weights of ``seed`` (or its directory's)."""
    return resolve_model(name, checks=True).build(seed)


class Family:
    """What the runtime needs to know about a model of one family. The reference family:
    :class:`partita.models.llama.Transformer` (and its pipeline stages)."""

    name = "reference"
    #: whether the forward derives token positions from its input's length, so a sequence
    #: shard would get the wrong ones (the runtime then runs it as a stage that passes them)
    positions_from_input = False

    def layers(self, model: nn.Module) -> Any:
        """The container of the transformer blocks (a ModuleDict or ModuleList)."""
        return model.layers

    def logits(self, model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return model(tokens)

    def aux_loss(self, model: nn.Module) -> torch.Tensor:
        """The MoE load-balancing loss of the last forward (zero for a dense model)."""
        import torch
        fn = getattr(model, "aux_loss", None)
        return fn() if callable(fn) else torch.zeros(())

    def vocab(self, model: nn.Module) -> int:
        return model.cfg.vocab

    def spec_of(self, model: nn.Module) -> ModelSpec:
        """The planner's view of the built model, from its config."""
        from ..spec.model import ModelSpec, MoESpec
        c = model.cfg
        moe = MoESpec(c.num_experts, c.top_k, c.expert_ffn_hidden, c.shared_experts, c.shared_ffn_hidden) \
            if c.num_experts else None
        return ModelSpec(name="partita-model", hidden=c.hidden, layers=c.layers, heads=c.heads, kv_heads=c.kv_heads,
                         ffn_hidden=c.ffn_hidden, vocab=c.vocab, tied_embeddings=c.tied_embeddings, moe=moe,
                         source="built torch module")

    def hf_config(self, model: nn.Module) -> Any:
        """The transformers config ``--save-hf`` writes beside the weights (None: not an HF model)."""
        return None


class HFFamily(Family):
    """Hugging Face ``*ForCausalLM`` models (and :class:`partita.runtime.hf_pipeline.HFStage`),
    whose parameter names the runtime keeps."""

    name = "hf"
    positions_from_input = True

    def layers(self, model: nn.Module) -> Any:
        return model.model.layers

    def logits(self, model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=tokens, use_cache=False)
        return getattr(out, "logits", out)  # an HF model's output, or an HFStage's logits

    def aux_loss(self, model: nn.Module) -> torch.Tensor:
        """Zero: HF MoE models' router loss is not part of the training loss here."""
        import torch
        return torch.zeros(())

    def vocab(self, model: nn.Module) -> int:
        return model.config.vocab_size

    def spec_of(self, model: nn.Module) -> ModelSpec:
        """From the ``config.json`` fields (:func:`partita.spec.hf_config.parse_hf_config`)."""
        from ..spec.hf_config import parse_hf_config
        return parse_hf_config(model.config.to_dict(), "model.config", type(model).__name__)

    def hf_config(self, model: nn.Module) -> Any:
        return model.config


REFERENCE, HF = Family(), HFFamily()


def family_of(model: nn.Module) -> Family:
    """The family of a built model (or pipeline stage): HF's module tree (``model.config`` and
    ``model.model.layers``) or the reference model's."""
    hf = hasattr(model, "config") and hasattr(model, "model") and hasattr(model.model, "layers")
    return HF if hf else REFERENCE
