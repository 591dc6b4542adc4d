"""Find a model by name or path: a built-in preset, an HF ``config.json`` (or a directory
holding one) or a Partita model JSON. Its own module so that ``model.py`` (the shapes) and
``hf_config.py`` (which builds them from HF configs) do not import each other."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..errors import PartitaError, unknown_name
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
    if path.suffix == ".json" or path.exists():
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise PartitaError(f"model file {path} does not exist")
        return load_json_model(path)
    raise unknown_name("model", name_or_path, presets)
