"""MindFormers' TeleChat2-115B published row runs an interleaved pipeline (issue 33: the worst
time-split row, +43 % before): its linked yaml (mindspore-lab/mindformers
research/telechat2/telechat2-115b/finetune_telechat_115b.yaml at bff73eaf6) sets
``parallel.pipeline_config.pipeline_interleave: True`` and ``model_config.pp_interleave_num: 3``,
which research/telechat2/telechat.py hands to ``LayerSetting`` ("each stage will be divided into
mini stages by pp_interleave_num", mindformers/parallel_core/training_graph/transformer/utils.py):
8 stages x 3 chunks of 4 of its 96 layers. The CSV cell is blank (the README table prints no
layout), so the loader's ``ERRATA`` fills it. Oracle: the yaml's values above and the
interleaved schedule's bubble, (pp - 1) / vpp of the plain one (Narayanan et al. 2021 sec. 2.2.2)."""
from __future__ import annotations

import out_of_sample as oos
from partita.estimate import estimate
from published_runs import ERRATA, load_cases


def _telechat115b():
    cases, _ = load_cases(oos.FULL_CSV)
    return next(c for c in cases if c.source == "mindformers" and c.name == "TeleChat2-115B"
                and c.metric == "step_time_s")


def test_the_row_runs_its_yamls_interleaved_pipeline():
    case = _telechat115b()
    assert (case.plan.pp, case.plan.vpp, case.plan.tp, case.plan.dp) == (8, 3, 8, 8)
    assert case.plan.schedule == "interleaved-1f1b"
    assert set(case.plan.stage_layers(case.model.layers)) == {4}  # 96 layers / (8 x 3)
    assert any(src == "mindformers" and model == "TeleChat2-115B" and col == "vpp" and "bff73eaf6" in why
               for src, model, col, _, why in ERRATA)


def test_interleaving_cuts_the_bubble_by_vpp():
    """Same row, same micro-batches: the pipeline bubble with vpp 3 is a third of the
    plain 1F1B one (within 5 %: the interleaved schedule's extra sends are priced apart)."""
    case = _telechat115b()
    inter = estimate(case.model, case.cluster, case.plan).time.parts["pipeline bubble"]
    plain = estimate(case.model, case.cluster, case.plan.with_(vpp=1, schedule="1f1b")).time.parts["pipeline bubble"]
    assert abs(inter / plain - 1 / 3) < 0.05 / 3
