"""An InternEvo training config (``torchrun --nproc_per_node N train.py --config configs/7B_sft.py``,
InternLM/InternEvo) read into a plan, without running it.

The config is a Python file of assignments; InternEvo executes it (``Config.from_file``). Partita does
not: :func:`read_assignments` evaluates only constants, earlier names, arithmetic, ``dict(...)`` /
``{...}`` / lists and subscripts of those; anything else (a call, an f-string, an import) is left
unknown, and a setting read from an unknown value is one line naming it.

Facts from InternLM/InternEvo@c628a8c:

- internlm/core/context/parallel_context.py: absent ``parallel`` entries default to ``zero1=dict(size=-1)``,
  ``pipeline=dict(size=1)``, ``tensor=dict(size=1, mode="mtp")``, ``weight=dict(size=1)``; the
  data-parallel size is ``world // pipeline // tensor`` (l.495, "the user should not set the data
  parallel size manually"); ``zero1`` size -1 (or <= 0) shards the optimizer over the whole data-parallel
  group, 1 is no ZeRO, ``k`` > 1 over groups of ``k`` (named: Partita shards over dp, less memory than the
  run when ``k`` < dp); ``zero1.fsdp`` true is torch FSDP (ZeRO-3);
- ``tensor.mode`` (configs/7B_sft.py's docstring): ``mtp`` tensor parallel without sequence parallel,
  ``msp`` / ``fsp`` with it; ``isp`` (sequence split with all-to-all attention plus ``weight`` parallel
  sharding) is refused in one line;
- ``data``: ``micro_bsz`` samples per micro-batch (packed into ``micro_bsz * seq_len`` tokens: the same
  tokens as Partita's mbs x seq_len), ``micro_num`` micro-batches per step, ``seq_len``: the global batch
  is ``micro_bsz * micro_num * dp``;
- ``model``: ``checkpoint`` False / True / a fraction: layers ``lid < num_layers * fraction`` of each
  pipeline chunk recomputed (internlm/model/modeling_internlm2.py l.857-861, l.910); ``num_chunks`` > 1 is
  the interleaved schedule with that many chunks; ``dtype`` a ``"torch.*"`` string.

The world size is the launcher's (not in the file): ``--devices``. The model (``model_type``, default
InternLM) is left to ``--model``, named.
"""
from __future__ import annotations

import ast
import math
import operator
import re
from typing import Any

from ..errors import PartitaError
from ..plan import Plan


class Unknown:
    """A value the reader does not evaluate (it names where it came from)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}>"


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def is_internevo(path: str, text: str) -> bool:
    """Whether ``text`` is an InternEvo config (a ``.py`` with ``parallel = dict(`` and ``data = dict(``)."""
    if not path.endswith(".py"):
        return False
    if "from internlm.utils.utils import read_base" in text:  # a config built from _base_ files: refused, named
        return True
    return bool(re.search(r"^parallel\s*=\s*dict\(", text, re.MULTILINE)) \
        and bool(re.search(r"^data\s*=\s*dict\(", text, re.MULTILINE))


def _eval(node: ast.AST, names: dict[str, Any]) -> Any:
    """The value of a config expression, or :class:`Unknown` (nothing is executed)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id, Unknown(node.id))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand, names)
        return -value if isinstance(value, (int, float)) and isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left, names), _eval(node.right, names)
        if isinstance(left, (int, float)) and isinstance(right, (int, float)) and not isinstance(left, bool) \
                and abs(left) < 1e18 and abs(right) < 1e18 and not (isinstance(node.op, ast.Pow) and right > 64):
            try:
                return _OPS[type(node.op)](left, right)
            except ArithmeticError:
                return Unknown(ast.unparse(node))
        return Unknown(ast.unparse(node))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args:
        return {k.arg: _eval(k.value, names) for k in node.keywords if k.arg}
    if isinstance(node, ast.Dict):
        return {_eval(k, names): _eval(v, names) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, names) for e in node.elts]
    if isinstance(node, ast.Subscript):
        base, key = _eval(node.value, names), _eval(node.slice, names)
        if isinstance(base, dict) and not isinstance(key, Unknown) and key in base:
            return base[key]
        return Unknown(ast.unparse(node))
    return Unknown(ast.unparse(node)[:60])


def read_assignments(text: str, path: str) -> dict[str, Any]:
    """The module-level ``NAME = value`` assignments of a config file, in order (later ones win)."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as e:
        raise PartitaError(f"{path}:{e.lineno}: not valid Python ({e.msg}); an InternEvo config is Python") from None
    names: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            value = _eval(stmt.value, names)
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = value
        elif isinstance(stmt, (ast.Import, ast.ImportFrom, ast.With)) and "_base_" in ast.unparse(stmt):
            raise PartitaError(f"{path}: a config built from _base_ files (read_base) is not read; write the "
                               "settings into one file, or pass the layout: partita estimate --tp T --pp P --mbs B")
    return names


def _get(section: Any, key: str, default: Any, where: str) -> Any:
    if not isinstance(section, dict):
        raise PartitaError(f"{where} is not a dict(...) of settings")
    value = section.get(key, default)
    if isinstance(value, Unknown):
        raise PartitaError(f"{where}[{key!r}] is {value.what}, which the reader does not evaluate; write the value")
    return value


def _whole(section: Any, key: str, default: Any, where: str) -> int:
    value = _get(section, key, default, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PartitaError(f"{where}[{key!r}] is {value!r}: a whole number is needed")
    return value


_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.half": "fp16", "torch.float32": "fp32",
           "torch.tf32": "fp32"}


def plan_from_internevo(names: dict[str, Any], path: str, world: int | None) -> tuple[Plan, tuple[str, ...]]:
    """(the plan, what it runs that Partita does not model) of a config's assignments on ``world`` ranks."""
    if world is None:
        raise PartitaError(f"{path}: an InternEvo config does not hold the device count (torchrun's "
                           "--nproc_per_node x nodes, or Slurm's): pass --devices")
    parallel, data, model = (names.get(k, {}) for k in ("parallel", "data", "model"))
    zero1 = _get(parallel, "zero1", {"size": -1}, f"{path}: parallel")
    tensor = _get(parallel, "tensor", {"size": 1, "mode": "mtp"}, f"{path}: parallel")
    pipeline = _get(parallel, "pipeline", {"size": 1}, f"{path}: parallel")
    tp = _whole(tensor, "size", 1, f"{path}: parallel['tensor']")
    mode = str(_get(tensor, "mode", "mtp", f"{path}: parallel['tensor']")).lower()
    if mode == "isp":
        raise PartitaError(f"{path}: tensor mode isp (InternEvo's sequence split with all-to-all attention and "
                           "weight-parallel sharding) is not read; estimate it with partita estimate --cp N --zero 3")
    if mode not in ("mtp", "msp", "fsp"):
        raise PartitaError(f"{path}: tensor mode {mode!r} is not one of InternEvo's mtp, msp, fsp, isp")
    pp = _whole(pipeline, "size", 1, f"{path}: parallel['pipeline']")
    if tp < 1 or pp < 1 or world % (tp * pp):
        raise PartitaError(f"world size {world} is not a multiple of tensor x pipeline = {tp} x {pp}")
    dp = world // pp // tp  # parallel_context.py l.495
    size = _whole(zero1, "size", -1, f"{path}: parallel['zero1']")
    fsdp = bool(_get(zero1, "fsdp", False, f"{path}: parallel['zero1']"))
    zero = 3 if fsdp else 0 if size == 1 or dp == 1 else 1
    notes = []
    if 1 < size < dp:
        notes.append(f"parallel zero1 size {size}: the optimizer sharded over groups of {size} of the {dp} data-"
                     "parallel ranks (estimated over all of them: less memory than the run)")
    mbs = _whole(data, "micro_bsz", None, f"{path}: data")
    accum = _whole(data, "micro_num", None, f"{path}: data")
    seq = _whole(data, "seq_len", None, f"{path}: data")
    chunks = _whole(model, "num_chunks", 1, f"{path}: model")
    layers = _get(model, "num_layers", None, f"{path}: model")
    checkpoint = _get(model, "checkpoint", False, f"{path}: model")
    fraction = float(checkpoint) if isinstance(checkpoint, (bool, int, float)) else 0.0
    recompute, rc_layers = ("none", 0) if fraction <= 0 else ("full", 0)
    if 0 < fraction < 1:
        if not isinstance(layers, int) or layers % (pp * chunks):
            raise PartitaError(f"{path}: model checkpoint {checkpoint} needs model num_layers divisible by "
                               "pipeline size x num_chunks to count the layers recomputed")
        per_chunk = layers // (pp * chunks)
        rc_layers = min(per_chunk, math.ceil(per_chunk * fraction))  # lid < num_layers * fraction
        rc_layers = 0 if rc_layers == per_chunk else rc_layers
    dtype = _get(model, "dtype", "torch.bfloat16", f"{path}: model")
    if dtype not in _DTYPES:
        raise PartitaError(f"{path}: model dtype {dtype!r} is not one of {', '.join(_DTYPES)}")
    if _get(model, "num_experts", 1, f"{path}: model") not in (1, None):
        notes.append("model num_experts: InternEvo's MoE (its expert parallel group) is estimated as the model "
                     "--model gives")
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=chunks, sp=mode in ("msp", "fsp") and tp > 1, zero=zero, mbs=mbs,
                gbs=mbs * accum * dp, seq_len=seq, recompute=recompute, recompute_layers=rc_layers,
                dtype=_DTYPES[dtype], schedule="interleaved-1f1b" if chunks > 1 else "1f1b", framework="internevo")
    return plan, tuple(notes)


def model_note(names: dict[str, Any]) -> str:
    """Why the model is not read: InternEvo builds it from ``model_type`` and the ``model`` settings."""
    model = names.get("model", {}) if isinstance(names.get("model"), dict) else {}
    kind = names.get("model_type", "INTERNLM")
    shape = ", ".join(f"{k} {model[k]}" for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size")
                      if k in model and not isinstance(model[k], Unknown))
    return f"the config builds {kind} ({shape}): pass --model (a preset or its config.json)"
