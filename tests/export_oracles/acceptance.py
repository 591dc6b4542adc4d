"""Acceptance figures of the export matrix by each target's own parser and validation.

    PYTHONPATH=src:tests python tests/export_oracles/acceptance.py

Megatron-LM: core_v0.16.1's option table and the validate_args rules the exporter relies on;
MindSpeed-LLM: its flags and validate_args rules (megatron_oracle.mindspeed_validate); DeepSpeed:
DeepSpeedConfig; torchtitan: ConfigManager, Trainer.Config, build_mesh and, with pp > 1, its stage
splitter (the real Megatron parse_args/validate_args: megatron_real_check.py, which needs a
Megatron-LM checkout). The checks are tests/test_export_frameworks.py's ``accept``.
"""
from __future__ import annotations

import sys


def main() -> int:
    from export_oracles.plans import MATRIX
    from partita.errors import PartitaError
    from partita.export import export
    from partita.spec.load import load_model
    from test_export_frameworks import accept
    for target in ("megatron", "mindspeed", "torchtitan", "deepspeed"):
        accepted = refused = exported = 0
        for pid, model_name, plan in MATRIX:
            model = load_model(model_name)
            try:
                out = export(target, plan, model)
            except PartitaError:
                refused += 1
                continue
            exported += 1
            try:
                accept(target, out.text, plan, model)
                accepted += 1
            except BaseException as e:  # noqa: BLE001 - tyro exits, torchtitan raises, DeepSpeed asserts
                print(f"{target} {pid}: {type(e).__name__}: {str(e)[:160]}")
        print(f"{target}: accepted {accepted} of {exported} exported ({refused} refused with a reason)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
