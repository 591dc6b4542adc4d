"""Acceptance figures of the export matrix by torchtitan's and DeepSpeed's own parsers.

    PYTHONPATH=src:tests python tests/export_oracles/acceptance.py

(Megatron-LM / MindSpeed-LLM: megatron_real_check.py, which needs a Megatron-LM checkout.)
An export counts as accepted when the oracle raises nothing and, for torchtitan with pp > 1,
torchtitan's stage splitter gives the plan's layers per stage.
"""
from __future__ import annotations

import json
import shlex
import sys
from types import SimpleNamespace


def _tokens(text: str) -> list[str]:
    body = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    return shlex.split(body.replace("\\\n", " "))


def _titan_stage_layers(par, layers: int) -> list[int]:
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata
    stages, n, first, last = _get_pipeline_metadata(SimpleNamespace(pp=par.pipeline_parallel_degree), par,
                                                     SimpleNamespace(layers=[None] * layers))
    return [sum(m.startswith("layers.") for m in p) for p in _generate_llm_fqn_per_model_part(stages, n, first, last)]


def _accept(target: str, text: str, plan, model) -> None:
    from export_oracles import deepspeed_oracle, torchtitan_oracle
    if target == "deepspeed":
        deepspeed_oracle.load(json.loads(text), plan.world_size, plan.dp)
        return
    cfg = torchtitan_oracle.parse(_tokens(text))
    torchtitan_oracle.build_mesh(cfg.parallelism, plan.world_size)
    if plan.pp > 1:
        got = _titan_stage_layers(cfg.parallelism, model.layers)
        assert got == list(plan.stage_layers(model.layers)), f"stage layers {got}"


def main() -> int:
    from export_oracles.plans import MATRIX
    from partita.errors import PartitaError
    from partita.export import export
    from partita.spec.load import load_model
    for target in ("torchtitan", "deepspeed"):
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
                _accept(target, out.text, plan, model)
                accepted += 1
            except BaseException as e:  # noqa: BLE001 - tyro exits, torchtitan raises, DeepSpeed asserts
                print(f"{target} {pid}: {type(e).__name__}: {str(e)[:160]}")
        print(f"{target}: accepted {accepted} of {exported} exported ({refused} refused with a reason)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
