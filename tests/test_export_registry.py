"""The export registry (issue 31 item 3): one list of targets read by every command, exporters
that receive the plan, the model and the cluster, Megatron's arguments as a mapping with
MindSpeed-LLM as an overlay on it, and ``export --model ''`` refused in one line.

Oracles: the commands' own argparse choices (what a user can type), the cluster the CLI built
(seen by a target added to the registry in the test), and MindSpeed-LLM export text written out
by hand from its documented flags for one plan that exercises every overlay operation.
"""
from __future__ import annotations

import pytest

from partita.cli import main
from partita.cli.main import build_parser
from partita.errors import PartitaError
from partita.export import Export, ExportContext, export, registry
from partita.export.megatron import MegatronArgs, Overlay
from partita.plan import Plan
from partita.spec.load import load_model


def _choices(command: str, option: str) -> list[str]:
    """The ``choices`` of ``partita COMMAND OPTION`` as argparse holds them."""
    sub = next(a for a in build_parser()._actions if a.choices and command in a.choices).choices[command]
    return list(next(a for a in sub._actions if option in a.option_strings).choices)


def test_every_command_offers_the_registry_targets():
    names = registry.target_names()
    assert names == ["megatron", "mindspeed", "deepspeed", "torchtitan", "llamafactory",  # issue 36
                     "slurm", "k8s-trainjob", "k8s-pytorchjob", "k8s-ascendjob"]  # issue 34: launch artefacts
    assert _choices("export", "--to") == names
    assert _choices("plan", "--export") == names
    assert _choices("import", "--from") == registry.importable_names()
    # the framework configs read back into a plan; the launch artefacts have no importer
    assert [t.name for t in registry.TARGETS if t.importer is None] == names[5:]


def test_unknown_target_is_one_line_naming_the_targets():
    with pytest.raises(PartitaError, match="unknown export target 'lsf'; choose one of megatron, mindspeed, "
                                           "deepspeed, torchtitan, llamafactory, slurm, k8s-trainjob, k8s-pytorchjob, "
                                           "k8s-ascendjob$"):
        export("lsf", Plan(dp=8, gbs=8))


@pytest.fixture
def cluster_target(monkeypatch):
    """A target added by one registry entry whose exporter needs the cluster (as issue 34's Slurm
    one will); the contexts it was given."""
    seen: list[ExportContext] = []

    def export_nodes(ctx: ExportContext) -> Export:
        if ctx.cluster is None:
            raise PartitaError("nodes needs a cluster")
        seen.append(ctx)
        return Export("nodes", f"#SBATCH --nodes={ctx.cluster.nodes}\n")

    extra = registry.ExportTarget("nodes", "a test target that reads the cluster", export_nodes)
    monkeypatch.setattr(registry, "TARGETS", registry.TARGETS + (extra,))
    return seen


def test_a_target_needing_the_cluster_is_one_registry_entry(cluster_target, capsys):
    """plan --export hands the searched cluster (2 nodes of 8) to the new target's exporter."""
    rc = main(["plan", "--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "16", "--global-batch", "16",
               "--seq-len", "256", "--top", "1", "--export", "nodes"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "#SBATCH --nodes=2\n" in out
    ctx = cluster_target[-1]
    assert (ctx.cluster.nodes, ctx.cluster.devices_per_node, ctx.model.name) == (2, 8, "tiny-llama")
    assert ctx.plan.world_size == 16


def test_a_target_needing_the_cluster_refuses_without_one(cluster_target, tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    Plan(dp=8, gbs=8).to_json(plan_file)
    assert main(["export", "--to", "nodes", str(plan_file)]) == 2
    assert capsys.readouterr().err.strip() == "partita: error: nodes needs a cluster"


@pytest.mark.parametrize("name", ["", "  "])
def test_export_with_an_empty_model_is_one_line(tmp_path, capsys, name):
    """An empty --model once read as "no model" and exported without the model's checks."""
    plan_file = tmp_path / "plan.json"
    Plan(dp=8, gbs=8).to_json(plan_file)
    assert main(["export", "--to", "megatron", str(plan_file), "--model", name]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("partita: error: --model is empty; give a model name (see `partita models`) or a "
                            "config.json, or leave --model out to export the parallel layout only\n")


def test_megatron_args_refuse_a_flag_written_twice():
    args = MegatronArgs()
    args.set("--bf16")
    with pytest.raises(ValueError, match="--bf16 is written twice"):
        args.set("--bf16")


def test_overlay_adds_replaces_and_removes_by_flag_name():
    base = MegatronArgs()
    for flag, *values in (["--tp", 2], ["--cp-comm-type", "p2p"], ["--moe-layer-freq", "[0,1]"], ["--bf16"]):
        base.set(flag, *values)
    add = MegatronArgs()
    add.set("--use-flash-attn")
    add.set("--moe-layer-freq", 1)
    out = Overlay(add, frozenset({"--cp-comm-type", "--not-there"})).apply(base)
    assert out.argv() == ["--tp", "2", "--bf16", "--use-flash-attn", "--moe-layer-freq", "1"]
    assert "--cp-comm-type" in base  # the base is left as it was


def test_mindspeed_is_megatron_with_its_overlay():
    """DeepSeek-V3 with tp+sp+tp_comm_overlap and cp: MindSpeed drops --tp-comm-overlap (MC2 replaces it) and
    --cp-comm-type (its own CP algorithm) and --moe-grouped-gemm (MindSpeed-LLM's validate_args refuses it with
    MC2 in a MoE model), replaces the --moe-layer-freq pattern by its int pair, and writes its flags after
    Megatron's, which keep their order."""
    model = load_model("deepseek-v3")
    plan = Plan(dp=2, tp=4, cp=2, sp=True, zero=1, mbs=1, gbs=16, seq_len=4096, ep=2, tp_comm_overlap=True)
    mega = export("megatron", plan, model).data
    mind = export("mindspeed", plan, model).data
    flags = [t for t in mind if t.startswith("--")]
    kept = [t for t in mega if t.startswith("--") and t not in ("--tp-comm-overlap", "--cp-comm-type",
                                                                "--moe-layer-freq", "--moe-grouped-gemm")]
    assert flags[:len(kept)] == kept
    assert flags[len(kept):] == ["--use-flash-attn", "--use-fused-rotary-pos-emb", "--use-rotary-position-embeddings",
                                 "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-ascend-mc2",
                                 "--context-parallel-algo", "--use-cp-send-recv-overlap", "--moe-alltoall-overlap-comm",
                                 "--first-k-dense-replace", "--moe-layer-freq"]
    assert mind[-4:] == ["--first-k-dense-replace", str(model.moe.first_dense_layers), "--moe-layer-freq",
                         str(model.moe.layer_freq)]
    assert "--tp-comm-overlap" in mega and "--cp-comm-type" in mega and "--moe-grouped-gemm" in mega
    assert "--moe-grouped-gemm" not in mind
    assert any("--moe-grouped-gemm with --use-ascend-mc2" in w for w in export("mindspeed", plan, model).warnings)
