"""FlagScale's Hydra YAML (FlagOpen/FlagScale ``examples/*/conf/train.yaml`` and ``conf/train/*.yaml``)
read as the Megatron-LM command line FlagScale launches.

FlagScale keeps Megatron's arguments in YAML: the experiment file names the launcher
(``experiment.runner``: ``nnodes``, ``nproc_per_node``, ``hostfile``) and, through its Hydra
``defaults`` list (``- train: 7b``), the training file ``conf/train/7b.yaml``, whose ``system``,
``model`` and ``data`` sections are Megatron's flags. FlagScale turns them into the command line
with ``flatten_dict_to_args`` (FlagOpen/FlagScale@da4935e flagscale/runner/utils.py, called by
flagscale/runner/runner_train.py ``_get_args_megatron``): the three sections merged in that order
(a later key replaces an earlier one), nested maps flattened (``precision: {bf16: true}`` is
``--bf16``), ``_`` in a key written ``-``, ``true`` a bare flag, ``false`` left out, a list its
items after the flag, anything else ``--key value``. That command line is then read by
:mod:`.megatron` like any other.

The world size is the runner's as ``runner_train.py`` computes it: without a hostfile, one node of
``min(nproc_per_node, the count of *_VISIBLE_DEVICES)`` (either alone if only one is given, 1 if
neither); with a hostfile, its node count, which only the cluster knows (``--devices``).

The YAML is loaded with PyYAML (:mod:`.yaml_file`), and OmegaConf's absolute ``${a.b.c}``
interpolation is resolved here; nothing else of Hydra (no ``??`` resolvers: such a value stays text).
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from ..errors import PartitaError
from .yaml_file import read_yaml_mapping

#: A FlagScale file: the experiment's Megatron task, or a training file's Megatron sections.
_EXPERIMENT = re.compile(r"^experiment:\s*$(?s:.*)^\s+backend:\s*megatron\b", re.MULTILINE)
_TRAIN = re.compile(r"^system:\s*$(?s:.*)^model:\s*$", re.MULTILINE)
_REF = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def is_flagscale(path: str, text: str) -> bool:
    """Whether ``path`` is a FlagScale experiment or training YAML (Megatron backend)."""
    return path.endswith((".yaml", ".yml")) and bool(_EXPERIMENT.search(text) or _TRAIN.search(text))


def read_yaml(text: str, path: str) -> dict[str, Any]:
    """The nested maps and lists of a FlagScale YAML file, loaded as OmegaConf loads it (PyYAML)."""
    return read_yaml_mapping(text, path, "a FlagScale YAML file")


def _lookup(root: dict[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def _resolve(node: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """OmegaConf's ``resolve=True`` for absolute ``${a.b}`` references (others stay text)."""
    if isinstance(node, dict):
        return {k: _resolve(v, root, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root, depth) for v in node]
    if not isinstance(node, str) or depth > 10:
        return node
    whole = _REF.fullmatch(node)
    try:
        if whole:
            return _resolve(_lookup(root, whole.group(1)), root, depth + 1)
        return _REF.sub(lambda m: str(_resolve(_lookup(root, m.group(1)), root, depth + 1)), node)
    except KeyError:
        return node


def _flatten(config: dict[str, Any]) -> list[str]:
    """FlagScale's ``flatten_dict_to_args`` (module docstring)."""
    args: list[str] = []
    for key, value in config.items():
        if key in ("log_dir", "details_dir", "scripts_dir", "pids_dir"):
            continue
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, dict):
            args.extend(_flatten(value))
        elif isinstance(value, list):
            args += [flag, *(str(v) for v in value)]
        elif isinstance(value, bool):
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args


def _train_file(path: str, doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the training config, the experiment config or None) of ``path``: an experiment file loads its
    ``defaults`` entry ``train: NAME`` from ``train/NAME.yaml`` beside it."""
    if "system" in doc and "model" in doc:
        return doc, None
    names = [e["train"] for e in doc.get("defaults") or [] if isinstance(e, dict) and "train" in e]
    if not names:
        raise PartitaError(f"{path}: a FlagScale experiment without a '- train: NAME' default (its training config)")
    train = Path(path).resolve().parent / "train" / f"{names[-1]}.yaml"
    if not train.is_file():
        raise PartitaError(f"{path}: its training config {train} is not here (give that file and --devices)")
    try:
        text = train.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise PartitaError(f"{path}: cannot read its training config {train}: {type(e).__name__}") from None
    return read_yaml(text, str(train)), doc


def _world(experiment: dict[str, Any] | None, path: str) -> int | None:
    """The launcher's world size (module docstring), None where only the cluster knows it."""
    if experiment is None:
        return None
    exp = experiment.get("experiment") or {}
    runner, envs = exp.get("runner") or {}, exp.get("envs") or {}
    if runner.get("hostfile") not in (None, "null"):
        return None
    visible = next((v for k, v in envs.items() if str(k).endswith("_VISIBLE_DEVICES")), None)
    count = len(str(visible).split(",")) if visible is not None else None
    nproc = runner.get("nproc_per_node")
    if isinstance(nproc, str) and not nproc.isdigit():
        return None
    return min(int(nproc), count) if nproc is not None and count else int(nproc) if nproc is not None else count or 1


def flagscale_command(path: str, raw: str, devices: int | None = None) -> tuple[str, int | None, str]:
    """(``pretrain_gpt.py ARGS`` as FlagScale launches it, the world size, a note or ""); a world size
    that only the cluster knows (a hostfile, a training file alone) without ``devices`` is one line."""
    doc = read_yaml(raw, path)
    train, experiment = _train_file(path, doc)
    root = dict(experiment or {}, train=train)
    train = _resolve(train, root)
    if (train.get("system") or {}).get("enable_hetero") or "hetero_process_meshes" in str(train.get("system")):
        raise PartitaError(f"{path}: a heterogeneous FlagScale run (enable_hetero, per-mesh parallel sizes): "
                           "Partita plans one mesh; pass a homogeneous training config (no hetero_* keys) and --devices")
    merged: dict[str, Any] = {}
    for section in ("system", "model", "data"):
        merged.update(train.get(section) or {})
    world = devices or _world(experiment, path)
    if world is None:
        runner = ((experiment or {}).get("experiment") or {}).get("runner") or {}
        where = (f"the hostfile's node count ({runner.get('hostfile')}; runner nnodes {runner.get('nnodes', '-')}, "
                 f"nproc_per_node {runner.get('nproc_per_node', '-')})") if experiment is not None else \
            "the experiment file's runner (this is a training config alone)"
        raise PartitaError(f"{path}: the device count is {where}, not in the file: pass --devices")
    return shlex.join(["pretrain_gpt.py", *_flatten(merged)]), world, ""


#: FlagScale training entry points whose model is not a transformer (flagscale/train/train_rwkv.py, ...).
_NOT_TRANSFORMER = re.compile(r"rwkv|mamba|hybrid", re.IGNORECASE)


def model_kind_note(path: str, raw: str) -> str:
    """Why the model of a FlagScale experiment is not read from its flags (its entry point trains a
    model that is not a transformer, e.g. ``train_rwkv.py``), or ""."""
    try:
        entry = ((read_yaml(raw, path).get("experiment") or {}).get("task") or {}).get("entrypoint") or ""
    except PartitaError:
        return ""
    if not _NOT_TRANSFORMER.search(str(entry)):
        return ""
    return (f"the experiment trains with {entry}, not a transformer (its layer count and widths mean other "
            "things): Partita models transformer layers only; pass --model for an estimate of a transformer")
