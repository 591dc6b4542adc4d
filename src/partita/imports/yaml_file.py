"""A YAML launch file read with PyYAML's safe loader, as the tools that run it read it.

Why PyYAML and not a reader of our own: LLaMA-Factory reads its training YAML with
``yaml.safe_load`` (HfArgumentParser.parse_yaml_file) and FlagScale's Hydra/OmegaConf loads
through PyYAML too, so the same loader gives the same values (YAML 1.1: ``yes``/``on`` are true).
One known difference: OmegaConf reads ``1e-5`` as a float where PyYAML 1.1 keeps the text; no
value Partita reads from these files is such a float, and a flag written back keeps its text.
"""
from __future__ import annotations

from typing import Any

from ..errors import PartitaError


def read_yaml_mapping(text: str, path: str, what: str) -> dict[str, Any]:
    """The top-level mapping of YAML ``text``; invalid YAML or a document that is not a
    mapping is one line naming ``path`` (and the line PyYAML stopped at) and ``what`` it should be."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PartitaError(f"{where}: not valid YAML ({problem}); {what} is a mapping of 'key: value' lines") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise PartitaError(f"{path}: {what} is a mapping of 'key: value' lines, not a YAML {type(doc).__name__}")
    return doc
