"""Find a model by name or path: a built-in preset, an HF ``config.json`` (or a directory
holding one) or a Partita model JSON. Its own module so that ``model.py`` (the shapes) and
``hf_config.py`` (which builds them from HF configs) do not import each other."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..errors import PartitaError, unknown_name
from ..inputs import path_exists, read_json, short
from .hf_config import load_json_model
from .model import PRESETS_FILE, ModelSpec


@lru_cache(maxsize=1)
def _presets() -> dict[str, dict]:
    with open(PRESETS_FILE) as f:
        return json.load(f)


def preset_names() -> list[str]:
    return sorted(_presets())


def load_model(name_or_path: str) -> ModelSpec:
    """A built-in preset by name, an HF ``config.json`` or a Partita model JSON."""
    presets = _presets()
    if name_or_path.lower() in presets:
        data = dict(presets[name_or_path.lower()])
        return ModelSpec.from_dict({"name": name_or_path.lower(), **data}, f"preset {name_or_path}")
    path = Path(name_or_path)
    if path.suffix == ".json" or path_exists(path):
        if path_exists(path) and path.is_dir():
            path = path / "config.json"
        if not path_exists(path):
            raise PartitaError(f"model file {short(str(path))} does not exist")
        return _load_file(path)
    raise unknown_name("model", name_or_path, presets)


#: JSON types of the HF config.json fields the parsers read besides the sizes (which
#: ``hf_config._Fields.int`` checks): a wrong type would otherwise be truthy/falsy or
#: unhashable deep inside the parser.
_HF_TYPES: dict[str, tuple[type, ...]] = {
    "model_type": (str,), "hidden_act": (str,), "activation_function": (str,), "tie_word_embeddings": (bool,),
    "attention_bias": (bool,), "mlp_bias": (bool,), "use_qk_norm": (bool,), "norm_topk_prob": (bool,),
    "rope_scaling": (dict,), "_name_or_path": (str,), "use_parallel_residual": (bool,), "bias": (bool,),
}


def _load_file(path: Path) -> ModelSpec:
    """An HF config.json (it has ``model_type``) or a Partita model JSON, each field's type
    checked at the edge (see :data:`_HF_TYPES`)."""
    cfg = read_json(path, "model")
    if not isinstance(cfg, dict):
        raise PartitaError(f"model file {short(str(path))} must hold a JSON object (an HF config.json or a "
                           "Partita model)")
    if "model_type" in cfg:
        for key, kinds in _HF_TYPES.items():
            value = cfg.get(key)
            if value is not None and not isinstance(value, kinds):
                want = {"str": "a string", "bool": "true or false", "dict": "an object"}[kinds[0].__name__]
                raise PartitaError(f"{short(str(path))}: field {key!r} must be {want}, got {short(repr(value), 60)}")
    return load_json_model(path)
