"""Run Megatron-LM's REAL ``parse_args`` + ``validate_args`` + ``core_transformer_config_from_args``
on every Megatron export of the issue-14 matrix, and (``--dump-flags``) refresh the checked-in
flag table ``megatron_flags.json`` that tests/test_export.py parses against.

Not a pytest test: Megatron-LM's ``megatron/training`` (where ``arguments.py`` lives) is not on
PyPI - the ``megatron-core`` wheel ships ``megatron/core`` only - so CI cannot import it. Run by
hand with a checkout of a Megatron-LM release tag (``git clone -b core_v0.16.1
https://github.com/NVIDIA/Megatron-LM``) and its import-time dependencies (six, triton,
einops ...) on ``PYTHONPATH``::

    PYTHONPATH=/path/to/Megatron-LM:tests python tests/export_oracles/megatron_real_check.py [--dump-flags]

CPU notes: ``get_device_arch_version`` (a CUDA query) is replaced by 9 (Hopper), and
``CUDA_DEVICE_MAX_CONNECTIONS`` is set as each export's header comment tells the user.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

FLAGS_JSON = Path(__file__).with_name("megatron_flags.json")


def export_args(text: str) -> tuple[list[str], dict]:
    """Arguments and ``export VAR=value`` lines of a rendered export."""
    env = {}
    for line in text.splitlines():
        if line.startswith("# export "):
            key, value = line[len("# export "):].split("=", 1)
            env[key] = value
    body = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    return shlex.split(body.replace("\\\n", " ")), env


def _parser_actions(arguments) -> list[dict]:
    """Every option of Megatron's own parser: strings, nargs, type, choices, store_true/false."""
    captured = {}
    real = argparse.ArgumentParser.parse_known_args

    def grab(self, args=None, namespace=None):
        captured["parser"] = self
        return real(self, args, namespace)
    argparse.ArgumentParser.parse_known_args = grab
    try:
        sys.argv = ["pretrain_gpt.py"]
        arguments.parse_args(ignore_unknown_args=True)
    finally:
        argparse.ArgumentParser.parse_known_args = real
    rows = []
    for a in captured["parser"]._actions:
        if not a.option_strings or a.dest == "help":
            continue
        rows.append({"options": a.option_strings, "dest": a.dest, "kind": type(a).__name__,
                     "nargs": a.nargs, "type": getattr(a.type, "__name__", None),
                     "choices": [str(c) for c in a.choices] if a.choices is not None else None,
                     "const": a.const if isinstance(a.const, (int, float, str, bool)) else None,
                     "default": a.default if isinstance(a.default, (int, float, str, bool, type(None))) else None})
    return rows


def _cpu_stand_ins(arguments) -> None:
    """What a GPU node with Transformer Engine has and this CPU check has not: a Hopper device
    (arch 9, compute capability 9.0 for the grouped-GEMM check) and TE's fused RoPE kernel."""
    import torch
    from megatron.core.models.common.embeddings import rope_utils
    arguments.get_device_arch_version = lambda: 9
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = object()


#: MindSpeed-LLM's own flags (declared by MindSpeed, not Megatron), stripped before the
#: Megatron check of a ``--to mindspeed`` export; see export_oracles/megatron_oracle.py.
MINDSPEED_ONLY = {"--use-flash-attn": 0, "--use-fused-rotary-pos-emb": 0, "--use-rotary-position-embeddings": 0,
                  "--use-fused-rmsnorm": 0, "--use-fused-swiglu": 0, "--use-ascend-mc2": 0,
                  "--use-cp-send-recv-overlap": 0, "--moe-alltoall-overlap-comm": 0, "--context-parallel-algo": 1,
                  "--first-k-dense-replace": 1, "--noop-layers": 1, "--num-layer-list": 1}


def strip_mindspeed(args: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(args):
        if args[i] in MINDSPEED_ONLY:
            i += 1 + MINDSPEED_ONLY[args[i]]
            continue
        out.append(args[i])
        i += 1
    return out


def check(plan_rows, world_of, target: str = "megatron") -> list[tuple[str, str]]:
    from partita.errors import PartitaError
    from partita.export import export
    from partita.spec.load import load_model
    import megatron.training.arguments as arguments
    _cpu_stand_ins(arguments)
    results = []
    for name, model_name, plan in plan_rows:
        try:
            out = export(target, plan, load_model(model_name))
        except PartitaError as e:
            results.append((name, f"refused: {e}"))
            continue
        args, env = export_args(out.text)
        args = strip_mindspeed(args) if target == "mindspeed" else args
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        os.environ.update(env, WORLD_SIZE=str(world_of(plan)), RANK="0")
        sys.argv = ["pretrain_gpt.py", *args]
        try:
            ns = arguments.parse_args()
            arguments.validate_args(ns)
            arguments.core_transformer_config_from_args(ns)
            results.append((name, "accepted"))
        except BaseException as e:  # noqa: BLE001 - argparse exits, validate_args asserts
            results.append((name, f"rejected: {type(e).__name__}: {e}"))
    return results


def main() -> int:
    from export_oracles.plans import MATRIX
    if "--dump-flags" in sys.argv:
        import megatron.training.arguments as arguments
        FLAGS_JSON.write_text(json.dumps({"release": os.environ.get("MEGATRON_TAG", "core_v0.16.1"),
                                          "options": _parser_actions(arguments)}, indent=1) + "\n")
        print(f"wrote {FLAGS_JSON}")
    for target in ("megatron", "mindspeed"):
        results = check(MATRIX, lambda p: p.world_size, target)
        for name, verdict in results:
            print(f"{target} {name:24s} {verdict.splitlines()[0][:200]}")
        exported = [v for _, v in results if not v.startswith("refused")]
        print(f"{target}: accepted {sum(v == 'accepted' for v in exported)} of {len(exported)} exported "
              f"({len(results) - len(exported)} refused with a reason)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
