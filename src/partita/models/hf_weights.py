"""Hugging Face checkpoints in and out, shard by shard: ``--model DIR`` and ``--save-hf OUT``.

Loading (torchtitan's and Megatron-Bridge's approach, our own code): the model is built
with every parameter on the ``meta`` device (:func:`build_hf_meta`, no memory, no random
initialisation), its parameters are given uninitialised storage on the local device
(:func:`materialize`), the plan is applied (tensor parallel and FSDP keep only their
DTensor shard, pipeline stages only their layers, expert parallel only its experts), and
then each rank reads from the ``*.safetensors`` files only the slices it holds
(:func:`load_hf_weights`: ``safe_open(...).get_slice`` over the shard's global offsets,
from ``torch.distributed.tensor``'s own ``compute_local_shape_and_global_offset``).

Saving (:func:`save_hf_weights`): every parameter is gathered (DTensor ``full_tensor``,
experts all-gathered over the ep group), the lowest rank of each pipeline stage writes its
stage's tensors into ``model-0000k-of-0000N.safetensors`` files of at most
``max_shard_bytes`` each (one file: ``model.safetensors``), and rank 0 writes
``model.safetensors.index.json``, ``config.json`` and the source directory's tokenizer
files - the layout ``transformers.AutoModelForCausalLM.from_pretrained`` reads.

Names: the runtime keeps HF's parameter names (``runtime/hf_pipeline.py``); the one
family whose in-memory layout differs from its files is Mixtral in transformers 5 (fused
``experts.gate_up_proj`` [E, 2F, H] / ``experts.down_proj`` [E, H, F] in memory,
``block_sparse_moe.experts.e.w1/w3/w2.weight`` on disk): :class:`CheckpointReader` and
:func:`_to_file_names` translate.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from ..errors import PartitaError

#: model types whose HF weights the trainer loads (the runtime's HF support, docs/runtime.md)
WEIGHT_MODEL_TYPES = ("llama", "qwen2", "mixtral")
INDEX = "model.safetensors.index.json"
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
_WRAPPERS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
_FUSED = re.compile(r"^(model\.layers\.\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
#: Mixtral's router: ``mlp.gate`` in transformers 5's modules, ``block_sparse_moe.gate`` in its files
_ROUTER = re.compile(r"^(model\.layers\.\d+)\.mlp\.gate\.weight$")


def weight_map(path: Path) -> dict[str, Path]:
    """Tensor name -> file, from the index (sharded) or the files themselves."""
    from safetensors import safe_open
    index = path / INDEX
    if index.is_file():
        try:
            names = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PartitaError(f"{index}: not a safetensors index ({e})") from None
        missing = sorted({file for file in names.values() if not (path / file).is_file()})
        if missing:
            raise PartitaError(f"{index} names {len(missing)} file(s) that are not there, e.g. {missing[0]}")
        return {name: path / file for name, file in names.items()}
    out: dict[str, Path] = {}
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt") as f:
                out.update({name: file for name in f.keys()})
        except Exception as e:  # safetensors raises its own error types for a damaged header
            raise PartitaError(f"{file}: not a safetensors file ({type(e).__name__}: {e})") from None
    return out


def hf_config(path: str | Path):
    """The directory's transformers config, checked to be a model type we load weights of."""
    try:
        import transformers
    except ImportError:
        raise PartitaError("HF checkpoints need transformers: pip install 'partita[hf]'") from None
    config = transformers.AutoConfig.from_pretrained(str(path))
    if config.model_type not in WEIGHT_MODEL_TYPES:
        raise PartitaError(f"--model {path}: loading HF weights of model_type {config.model_type!r} is not supported "
                           f"(supported: {', '.join(WEIGHT_MODEL_TYPES)})")
    config._attn_implementation = "sdpa"
    return config


def build_hf_meta(path: str | Path) -> nn.Module:
    """The HF ``*ForCausalLM`` of ``path/config.json`` with its parameters on the meta device;
    :func:`partita.parallelize` reads each rank's slices of the directory's safetensors into
    its shards (``model.partita_source``)."""
    import transformers
    from .hf import build_hf_from_config
    config = hf_config(path)
    model = build_hf_from_config(config, transformers.AutoModelForCausalLM, meta=True)
    model.partita_source = str(path)
    return model


def materialize(model: nn.Module, device: torch.device) -> nn.Module:
    """Uninitialised storage on ``device`` for every meta parameter of the whole model (tied
    ones stay tied), for a caller that fills it itself; :func:`partita.parallelize` does
    better with a meta model: storage for this rank's shards only."""
    from .init import materialize_params
    return materialize_params(model, device)


class CheckpointReader:
    """Slices of the tensors of an HF safetensors directory, by in-memory parameter name."""

    def __init__(self, path: Path, tied: bool):
        self.path, self.tied = path, tied
        self.files = weight_map(path)
        self._open: dict[Path, object] = {}

    def _slice(self, name: str):
        from safetensors import safe_open
        file = self.files[name]
        if file not in self._open:
            self._open[file] = safe_open(str(file), "pt")
        return self._open[file].get_slice(name)

    def read(self, name: str, shape: tuple[int, ...], offset: tuple[int, ...], local: tuple[int, ...]) -> torch.Tensor:
        """The block ``offset .. offset + local`` of parameter ``name`` (global ``shape``)."""
        if name == "lm_head.weight" and name not in self.files and self.tied:
            name = "model.embed_tokens.weight"
        router = _ROUTER.match(name)
        if router and name not in self.files:
            name = f"{router.group(1)}.block_sparse_moe.gate.weight"
        if name in self.files:
            sl = self._slice(name)
            if tuple(sl.get_shape()) != tuple(shape):
                raise PartitaError(f"{self.path}: tensor {name} has shape {tuple(sl.get_shape())}, the model "
                                   f"built from config.json needs {tuple(shape)}")
            return sl[tuple(slice(o, o + n) for o, n in zip(offset, local))]
        fused = _FUSED.match(name)
        if fused:
            return self._read_fused(fused.group(1), fused.group(2), shape, offset, local)
        raise PartitaError(f"{self.path}: the checkpoint has no tensor {name} (a checkpoint of another model?)")

    def _read_fused(self, layer: str, kind: str, shape, offset, local) -> torch.Tensor:
        """Mixtral's fused experts from its per-expert files (w1 | w3 stacked into gate_up)."""
        rows = []
        for e in range(offset[0], offset[0] + local[0]):
            base = f"{layer}.block_sparse_moe.experts.{e}"
            if kind == "gate_up_proj":
                parts = [self._full(f"{base}.w1.weight"), self._full(f"{base}.w3.weight")]
                full = torch.cat(parts, dim=0)
            else:
                full = self._full(f"{base}.w2.weight")
            if tuple(full.shape) != tuple(shape[1:]):
                raise PartitaError(f"{self.path}: expert {e} of {layer} has shape {tuple(full.shape)}, "
                                   f"the model needs {tuple(shape[1:])}")
            rows.append(full[offset[1]:offset[1] + local[1], offset[2]:offset[2] + local[2]])
        return torch.stack(rows)

    def _full(self, name: str) -> torch.Tensor:
        if name not in self.files:
            raise PartitaError(f"{self.path}: the checkpoint has no tensor {name} (a checkpoint of another model?)")
        return self._slice(name)[:]


def _clean(name: str) -> str:
    for wrapper in _WRAPPERS:
        name = name.replace(wrapper, "")
    return name[len("module."):] if name.startswith("module.") else name


def _cores(pm) -> list[nn.Module]:
    return [m.module if isinstance(m, nn.parallel.DistributedDataParallel) else m for m in pm.modules]


def _placement(p: torch.Tensor, ep_rank: int) -> tuple[torch.Tensor, tuple, tuple, tuple]:
    """(local tensor, global shape, global offset, local shape) of a parameter as the plan
    left it: a DTensor's shard, an expert-parallel slice of dim 0, or the whole tensor."""
    if isinstance(p, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
        local_shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
        local = p.to_local()
        if tuple(local.shape) != tuple(local_shape):
            raise PartitaError(f"cannot place a shard of shape {tuple(local.shape)} (expected {tuple(local_shape)})")
        shape, offset = tuple(p.shape), tuple(offset)
        if getattr(p, "_partita_expert", False) and ep_rank >= 0:  # FSDP over this ep rank's experts
            n = p.shape[0]
            shape = (getattr(p, "_partita_ep", 1) * n,) + shape[1:]
            offset = (ep_rank * n + offset[0],) + offset[1:]
        return local, shape, offset, tuple(local_shape)
    shape, offset = tuple(p.shape), (0,) * p.dim()
    if getattr(p, "_partita_expert", False) and ep_rank >= 0:
        n = p.shape[0]
        offset = (ep_rank * n,) + offset[1:]
        shape = (getattr(p, "_partita_ep", 1) * n,) + shape[1:]
    return p.data, shape, offset, tuple(p.shape)


@torch.no_grad()
def load_hf_weights(pm, path: str | Path, tied: bool) -> int:
    """Fill every parameter of the parallel model ``pm`` with this rank's slice of the HF
    checkpoint in ``path``; returns the number of elements this rank read."""
    if getattr(pm, "init_source", None) == str(Path(path)):  # parallelize read them already
        return pm.init_read
    reader = CheckpointReader(Path(path), tied)
    ep = pm.plan.ep if pm.ep_group is not None else 1
    ep_rank = dist.get_rank(pm.ep_group) if pm.ep_group is not None else -1
    return fill_shards(_cores(pm), reader, ep, ep_rank)


@torch.no_grad()
def fill_shards(modules: list[nn.Module], source, ep: int, ep_rank: int) -> int:
    """Copy into every parameter of ``modules`` (unwrapped, storage allocated) this rank's
    slice of it from ``source`` (``read(name, global_shape, offset, local_shape)``: a
    :class:`CheckpointReader` or the runtime's seed initialiser); returns the number of
    elements written. One block is alive at a time, so a rank never holds a full model."""
    written = 0
    for module in modules:
        for name, p in module.named_parameters():
            p._partita_ep = ep
            local, shape, offset, local_shape = _placement(p, ep_rank)
            block = source.read(_clean(name), shape, offset, local_shape)
            local.copy_(block.to(local.dtype))
            written += block.numel()
            del block
    return written


def _gather(p: torch.Tensor, ep_group) -> torch.Tensor:
    """The whole parameter (a collective when it is sharded): the DTensor's full tensor
    (tp, FSDP), then, for an ep rank's experts, all ep ranks' experts concatenated."""
    full = p.full_tensor().detach() if isinstance(p, DTensor) else p.detach()
    if getattr(p, "_partita_expert", False) and ep_group is not None:
        parts = [torch.empty_like(full) for _ in range(dist.get_world_size(ep_group))]
        dist.all_gather(parts, full.contiguous(), group=ep_group)
        return torch.cat(parts, dim=0)
    return full


def _to_file_names(name: str, tensor: torch.Tensor, model_type: str) -> dict[str, torch.Tensor]:
    """The HF file layout of one in-memory tensor (Mixtral's router renamed and its fused
    experts split per expert, as transformers itself writes them)."""
    router = _ROUTER.match(name)
    if router and model_type == "mixtral":
        return {f"{router.group(1)}.block_sparse_moe.gate.weight": tensor}
    fused = _FUSED.match(name)
    if not fused:
        return {name: tensor}
    layer, kind = fused.groups()
    out = {}
    for e in range(tensor.shape[0]):
        base = f"{layer}.block_sparse_moe.experts.{e}"
        if kind == "gate_up_proj":
            w1, w3 = tensor[e].chunk(2, dim=0)
            out[f"{base}.w1.weight"], out[f"{base}.w3.weight"] = w1, w3
        else:
            out[f"{base}.w2.weight"] = tensor[e]
    return out


def _is_writer(plan, rank: int) -> bool:
    """The lowest rank of each pipeline stage writes that stage's tensors."""
    from ..plan import axis_index
    mine = axis_index(plan, "pp", rank)
    return all(axis_index(plan, "pp", r) != mine for r in range(rank))


def _split(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return [s for s in shards if s]


def save_hf_weights(pm, out: str | Path, config, max_shard_bytes: int, source: str | None = None) -> None:
    """Write the parallel model ``pm`` as an HF directory (collective: every rank calls it)."""
    from safetensors.torch import save_file
    out = Path(out)
    rank = dist.get_rank()
    writer = _is_writer(pm.plan, rank)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors: dict[str, torch.Tensor] = {}
    for module in _cores(pm):
        for name, p in module.named_parameters():
            full = _gather(p, pm.ep_group)
            name = _clean(name)
            if writer and not (tied and name == "lm_head.weight"):
                for file_name, t in _to_file_names(name, full, config.model_type).items():
                    tensors[file_name] = t.to("cpu", copy=True).contiguous()
    shards = _split(tensors, max_shard_bytes) if writer else []
    counts = [0] * dist.get_world_size()
    dist.all_gather_object(counts, len(shards))
    total, first = sum(counts), sum(counts[:rank])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    names: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = "model.safetensors" if total == 1 else f"model-{first + i + 1:05d}-of-{total:05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        names.update({name: file for name in shard})
    maps: list = [None] * dist.get_world_size()
    dist.all_gather_object(maps, (names, sum(t.numel() * t.element_size() for t in tensors.values())))
    if rank == 0:
        _write_side_files(out, config, maps, total, source)
    dist.barrier()


def _write_side_files(out: Path, config, maps: list, total: int, source: str | None) -> None:
    """config.json, the index (more than one file) and the source's tokenizer files."""
    config.dtype = torch.float32
    config.save_pretrained(str(out))
    if total > 1:
        weight_names = {k: v for names, _ in maps for k, v in names.items()}
        index = {"metadata": {"total_size": sum(size for _, size in maps)}, "weight_map": dict(sorted(weight_names.items()))}
        (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    if source and Path(source).is_dir():
        for name in SIDE_FILES:
            if (Path(source) / name).is_file() and name != "config.json":
                shutil.copy(Path(source) / name, out / name)
