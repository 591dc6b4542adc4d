"""Megatron-LM / MindSpeed-LLM command lines read as the frameworks run them (issue 32 items 2-3):
each layout or cost flag's effect on the plan, the model the command line defines, and the flags
named as not modelled. Each test failed on the reader before issue 32 (which ignored these flags,
read layouts with ``t*n`` entries only, took the model from ``--model`` alone).

Expected values are read off the frameworks' sources by hand (cited in
partita/imports/megatron*.py), not computed by the code under test."""
from __future__ import annotations

import shlex

import pytest

from conftest import rank0_states
from partita.errors import PartitaError
from partita.imports.megatron import plan_from_megatron, read_megatron
from partita.imports.megatron_layout import parse_pipeline_layout
from partita.imports.megatron_model import contradiction, model_from_megatron
from partita.spec.load import load_model

LLAMA70 = ("--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 "
           "--group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm "
           "--position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear "
           "--vocab-size 128256 --seq-length 4096 --bf16 ")
DSV3 = ("--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 "
        "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 "
        "--v-head-dim 128 --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048 "
        "--moe-shared-expert-intermediate-size 2048 --first-k-dense-replace 3 --moe-layer-freq 1 --swiglu "
        "--normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights "
        "--disable-bias-linear --padded-vocab-size 129280 --bf16 --use-distributed-optimizer ")


def plan(text: str, world: int, **kw):
    return plan_from_megatron(shlex.split(text), world, **kw)


def read(text: str, world: int, **kw):
    return read_megatron(shlex.split(text), world, **kw)


# ---------------------------------------------------------------- layout flags
def test_num_layer_list_is_the_split_of_each_rank():
    p = plan(LLAMA70 + "--pipeline-model-parallel-size 4 --num-layer-list 17,20,22,21", 32)
    assert p.layer_split == (17, 20, 22, 21) and p.vpp == 1


def test_num_layer_list_must_cover_the_layers():
    with pytest.raises(PartitaError, match="--num-layer-list 17,20,22 needs one entry per pipeline rank"):
        plan(LLAMA70 + "--pipeline-model-parallel-size 4 --num-layer-list 17,20,22", 32)


def test_noop_layers_occupy_places_and_leave_the_model():
    """DeepSeek-V3 on MindSpeed: 64 layers of which 61..63 are identity layers."""
    text = DSV3.replace("--num-layers 61", "--num-layers 64") + "--noop-layers 61,62,63 --pipeline-model-parallel-size 8"
    r = read(text, 64)
    assert r.plan.layer_split == (8, 8, 8, 8, 8, 8, 8, 5)
    assert r.model.layers == 61


def test_noop_layers_in_interleaved_chunks():
    """Noop 0 and 63 of 64 layers, pp 4, virtual stages of 2 layers: vpp 8, the first and last chunk 1 layer."""
    r = plan(LLAMA70.replace("--num-layers 80", "--num-layers 64") + "--pipeline-model-parallel-size 4 "
             "--num-layers-per-virtual-pipeline-stage 2 --noop-layers 0,63", 16)
    assert r.vpp == 8 and r.layer_split == (1,) + (2,) * 30 + (1,)


def test_decoder_first_and_last_pipeline_num_layers():
    p = plan(DSV3 + "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 13 "
             "--decoder-last-pipeline-num-layers 16 --expert-model-parallel-size 4", 16)
    assert p.layer_split == (13, 16, 16, 16)


def test_decoder_first_pipeline_num_layers_with_virtual_stages():
    """transformer_block.get_num_layers_to_build: each rank's layers split evenly over its virtual stages."""
    p = plan(LLAMA70.replace("--num-layers 80", "--num-layers 30") + "--pipeline-model-parallel-size 4 "
             "--decoder-first-pipeline-num-layers 6 --num-virtual-stages-per-pipeline-rank 2", 8)
    assert p.vpp == 2 and p.layer_split == (3, 4, 4, 4, 3, 4, 4, 4)


def test_embedding_and_loss_counted_in_the_split():
    p = plan(LLAMA70.replace("--num-layers 80", "--num-layers 30") + "--pipeline-model-parallel-size 4 "
             "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split", 8)
    assert p.layer_split == (7, 8, 8, 7)


@pytest.mark.parametrize("layout, stages", [
    ("Et*3|(tt|)*29,m|L", ["Ettt"] + ["tt"] * 29 + ["m", "L"]),   # Megatron's docstring example
    ("Et*2|(tt|)*5t|tmL", ["Ett", "tt", "tt", "tt", "tt", "tt", "t", "tmL"]),
    ("E|t*4|t*4|L", ["E", "tttt", "tttt", "L"]),
    ("E||t|L", ["E", "", "t", "L"]),                              # an empty stage (pipeline_parallel_layout.md)
])
def test_layout_grammar(layout, stages):
    assert parse_pipeline_layout(layout) == stages


def test_layout_gives_split_and_vpp():
    p = plan(DSV3.replace("--num-layers 61", "--num-layers 14").replace("--first-k-dense-replace 3", "")
             + "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --expert-model-parallel-size 16 "
             "--pipeline-model-parallel-layout 'Et*2|(tt|)*5t|tmL'", 64)
    assert p.vpp == 2 and p.layer_split == (2, 2, 2, 2, 2, 2, 1, 1) and p.schedule == "interleaved-1f1b"


@pytest.mark.parametrize("layout, message", [
    ("Et*4|x*4L", "invalid layer character 'x'"),
    ("t*4|Et*4L", "exactly one E"),
    ("Et*4|t*3L", "has 7 decoder layers"),
    ("Et*4|t*2|t*2L", "not a multiple of --pipeline-model-parallel-size 2"),
])
def test_layout_refusals_are_one_line(layout, message):
    with pytest.raises(PartitaError, match=message):
        plan(LLAMA70.replace("--num-layers 80", "--num-layers 8") + "--pipeline-model-parallel-size 2 "
             f"--pipeline-model-parallel-layout '{layout}'", 2)


def test_dualpipev_puts_two_v_chunks_on_each_rank():
    """MindSpeed's DualPipeV: rank r holds layers [4r, 4r+4) and [60-4r, 64-4r); noop 61..63 sit on rank 0."""
    text = DSV3.replace("--num-layers 61", "--num-layers 64") + ("--noop-layers 61,62,63 --pipeline-model-parallel-size 8 "
                                                                "--schedules-method dualpipev --moe-fb-overlap")
    r = read(text, 64)
    # the 16 chunks in layer order (chunk j on rank j, or 15 - j past the turn): rank 0 holds chunks 0 and 15
    assert r.plan.layer_split == (4,) * 15 + (1,) and r.plan.vpp == 2 and r.plan.schedule == "dualpipev"
    from partita.cost.placement import all_rank_layers, placement
    rank_layers = all_rank_layers(61, 8, r.plan.layer_split, placement(r.plan))
    assert [len(ids) for ids in rank_layers] == [5, 8, 8, 8, 8, 8, 8, 8]
    named = [n.split(" ")[0].rstrip(":") for n in r.not_modelled]  # both modelled: schedule=dualpipev and its pairs
    assert "--schedules-method" not in named and "--moe-fb-overlap" not in named
    without = read(text.replace(" --moe-fb-overlap", ""), 64)  # the overlap the plan prices is then missing
    assert any(n.startswith("--schedules-method dualpipev without --moe-fb-overlap") for n in without.not_modelled)


@pytest.mark.parametrize("experts", [["--num-experts", "8"], ["--num-experts=8"]])
@pytest.mark.parametrize("schedule", [["--schedules-method", "dualpipev"], ["--schedules-method=dualpipev"]])
def test_fb_overlap_note_reads_either_flag_form(experts, schedule):
    """argparse takes ``--flag value`` and ``--flag=value`` alike: a MoE model (``--num-experts=8``)
    under DualPipeV without --moe-fb-overlap is noted as optimistic in both forms (the ``=``
    form was missed), not with the overlap, and not for a dense model."""
    from partita.imports.megatron_features import unmodelled
    note = "--schedules-method dualpipev without --moe-fb-overlap"
    assert any(n.startswith(note) for n in unmodelled(experts + schedule))
    assert unmodelled(experts + schedule + ["--moe-fb-overlap"]) == []  # both modelled
    assert unmodelled(schedule) == []  # dense: no all-to-all to hide


# ---------------------------------------------------------------- degrees and knobs
def test_expert_tensor_parallel_defaults_to_tp_on_a_moe_model():
    """arguments.py: etp None -> tensor_model_parallel_size, whatever ep is (here ep 1)."""
    p = plan("--num-experts 16 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4", 16)
    assert p.etp == 4


def test_expert_tensor_parallel_given_wins_and_dense_keeps_1():
    assert plan("--num-experts 16 --tensor-model-parallel-size 4 --expert-tensor-parallel-size 1", 8).etp == 1
    assert plan(LLAMA70 + "--tensor-model-parallel-size 4", 8).etp == 1


def test_sequence_parallel_is_off_at_tp_1():
    assert plan(LLAMA70 + "--sequence-parallel", 8).sp is False
    assert plan(LLAMA70 + "--sequence-parallel --tensor-model-parallel-size 2", 8).sp is True


def test_recompute_activations_is_selective():
    assert plan(LLAMA70 + "--recompute-activations", 8).recompute == "selective"


def test_old_checkpoint_activations_is_full_recompute():
    p = plan(LLAMA70 + "--checkpoint-activations", 8)
    assert (p.recompute, p.recompute_layers) == ("full", 0)


def test_block_recompute_over_a_whole_chunk_is_every_layer():
    """80 layers, pp 4 x vpp 2: chunks of 10; --recompute-num-layers 16 > 10 recomputes all (Megatron accepts it)."""
    p = plan(LLAMA70 + "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 10 "
             "--recompute-granularity full --recompute-method block --recompute-num-layers 16", 8)
    assert (p.recompute, p.recompute_layers, p.vpp) == ("full", 0, 2)


def test_block_recompute_of_part_of_a_chunk():
    p = plan(LLAMA70 + "--pipeline-model-parallel-size 4 --recompute-granularity full --recompute-method block "
             "--recompute-num-layers 5", 8)
    assert (p.recompute, p.recompute_layers) == ("full", 5)


def test_fp8_and_bf16_gradient_reduction():
    p = plan(LLAMA70 + "--fp8-format hybrid --grad-reduce-in-bf16 --use-distributed-optimizer", 8)
    assert (p.dtype, p.grad_dtype, p.zero) == ("fp8", "bf16", 1)


def test_ascend_mc2_is_tp_comm_overlap():
    assert plan(LLAMA70 + "--tensor-model-parallel-size 8 --use-ascend-mc2", 8).tp_comm_overlap is True


def test_unfused_attention():
    assert plan(LLAMA70 + "--attention-backend unfused", 8).attention == "unfused"
    assert read(LLAMA70, 8, framework="mindspeed").plan.attention == "unfused"  # no --use-flash-attn
    assert read(LLAMA70 + "--use-flash-attn", 8, framework="mindspeed").plan.attention == "fused"


@pytest.mark.parametrize("flag", ["--optimizer-cpu-offload", "--swap-attention", "--swap-optimizer",
                                  "--moe-fb-overlap", "--recompute-activation-function", "--mtp-num-layers 1",
                                  "--no-pad-to-seq-lengths", "--variable-seq-lengths", "--stage dpo"])
def test_cost_flags_not_modelled_are_named(flag):
    r = read(LLAMA70 + flag, 8)
    assert [n.split(":")[0].split(" ")[0] for n in r.not_modelled] == [flag.split(" ")[0]]


def test_mindspeed_llm_lora_and_full_fine_tuning_are_plan_fields():
    # mindspeed_llm/features_manager/finetune/lora.py defaults: --lora-r 16, --lora-alpha 32; LoRA is on when
    # --lora-target-modules lists modules (tasks/posttrain/lora/utils.py is_enable_lora)
    p = plan(LLAMA70 + "--finetune --stage sft --lora-r 8 --lora-alpha 16 "
             "--lora-target-modules linear_qkv linear_proj linear_fc1 linear_fc2 --use-distributed-optimizer", 8)
    assert (p.finetune, p.lora_rank, p.lora_alpha, p.lora_targets) == ("lora", 8, 16.0, "all-linear")
    p = plan(LLAMA70 + "--lora-target-modules linear_qkv linear_proj", 8)
    assert (p.finetune, p.lora_rank, p.lora_alpha, p.lora_targets) == ("lora", 16, 32.0, "attention")
    assert plan(LLAMA70 + "--lora-r 8", 8).finetune == "none"  # no target modules: no LoRA
    assert plan(LLAMA70 + "--finetune --stage sft --is-instruction-dataset", 8).finetune == "full"
    assert plan(LLAMA70 + "--finetune", 8).finetune == "none"  # Megatron's: load without the optimizer state
    p = plan(LLAMA70 + "--lora-target-modules linear_q linear_kv linear_fc1 linear_fc2 linear_q_up_proj "
             "linear_o_down_proj linear_o_up_proj", 8)  # DeepSeek-V4's names (MindSpeed-LLM deepseek4_flash)
    assert p.lora_targets == "all-linear"
    r = read(LLAMA70 + "--lora-target-modules linear_qkv", 8)  # q/k/v exactly: plan qkv (NeMo 1.x's default)
    assert r.plan.lora_targets == "qkv" and not r.not_modelled
    r = read(LLAMA70 + "--lora-target-modules linear_proj", 8)  # part of the attention linears: read wider, named
    assert r.plan.lora_targets == "attention" and "linear_proj: adapters on these linears only" in r.not_modelled[0]
    with pytest.raises(PartitaError, match="lm_head is not a linear Partita knows"):
        plan(LLAMA70 + "--lora-target-modules lm_head", 8)


def test_supervised_fine_tuning_stage_is_not_a_departure():
    assert read(LLAMA70 + "--finetune --stage sft --is-instruction-dataset", 8).not_modelled == ()


def test_mindspeed_llms_deprecated_moe_intermediate_size_is_the_expert_ffn():
    # mindspeed_llm/features_manager/arguments/deprecated_args.py: moe_ffn_hidden_size = moe_intermediate_size
    argv = shlex.split(LLAMA70 + "--num-experts 64 --moe-router-topk 8 --moe-intermediate-size 768")
    assert model_from_megatron(argv).spec.moe.expert_ffn_hidden == 768


def test_fp8_param_gather_and_reuse_fp32_param_are_plan_fields():
    p = plan(LLAMA70 + "--fp8-format hybrid --fp8-param-gather --use-distributed-optimizer", 8)
    assert (p.dtype, p.fp8_param_gather, p.reuse_fp32_param) == ("fp8", True, False)
    assert plan(LLAMA70 + "--fp8-param-gather --use-distributed-optimizer", 8).fp8_param_gather is False  # no fp8
    r = read(LLAMA70 + "--reuse-fp32-param --use-distributed-optimizer", 8, framework="mindspeed")
    assert r.plan.reuse_fp32_param is True and r.not_modelled == ()


def test_fp8_param_gather_keeps_one_byte_per_weight():
    # Megatron's parameter buffer for fp8 params is torch.uint8 (param_and_grad_buffer.py), in place
    # of the bf16 weight (2 bytes) and Transformer Engine's cached fp8 copy (1 byte)
    params = load_model("llama3-8b").total_params()
    base = rank0_states("llama3-8b", 8, dtype="fp8", grad_dtype="bf16")
    fp8 = rank0_states("llama3-8b", 8, dtype="fp8", grad_dtype="bf16", fp8_param_gather=True)
    assert fp8["weights"] == pytest.approx(params * 1)
    assert base["weights"] == pytest.approx(params * 3)
    assert (fp8["gradients"], fp8["optimizer"]) == (base["gradients"], base["optimizer"])


@pytest.mark.parametrize("zero,dp", [(0, 8), (1, 8), (2, 4)])
def test_reuse_fp32_param_saves_what_mindspeed_documents(zero, dp):
    # Ascend/MindSpeed@028de58 docs/zh/features/reuse-fp32-param.md: saves sizeof(bfloat16) x params
    # (Float16OptimizerWithFloat16Params), sizeof(bfloat16) x params / DP with the distributed optimizer
    params = load_model("llama3-8b").total_params()
    base = rank0_states("llama3-8b", dp, zero=zero)
    reused = rank0_states("llama3-8b", dp, zero=zero, reuse_fp32_param=True)
    saved = sum(base.values()) - sum(reused.values())
    assert saved == pytest.approx(2 * params / (dp if zero >= 1 else 1))


@pytest.mark.parametrize("fields,words", [
    ({"dtype": "fp8", "zero": 0, "fp8_param_gather": True}, "fp8_param_gather needs dtype fp8 and zero 1-3"),
    ({"dtype": "bf16", "fp8_param_gather": True}, "fp8_param_gather needs dtype fp8"),
    ({"dtype": "bf16", "zero": 3, "reuse_fp32_param": True}, "reuse_fp32_param needs dtype bf16"),
    ({"dtype": "fp16", "reuse_fp32_param": True}, "MindSpeed refuses it with fp16"),
])
def test_weight_storage_knobs_where_the_frameworks_refuse_them(fields, words):
    from partita.plan import Plan, check
    with pytest.raises(PartitaError) as e:
        check(Plan(dp=8, gbs=8, **fields), None, 8)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_megatrons_llama3_8b_fp8_example_fits_the_node_it_ships_for(capsys):
    # NVIDIA/Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh runs on one node of 8 80 GB H100s
    import json
    from pathlib import Path
    from partita.cli import main
    script = Path(__file__).parent / "data" / "launch_configs" / "megatron" / "llama3_8b_fp8_arrays.sh"
    assert main(["estimate", "--from-script", str(script), "--hardware", "h100-sxm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["devices"] == 8 and out["fits"] is True and out["not_modelled"] == []
    assert out["plan"]["fp8_param_gather"] is True


def test_context_parallel_algorithm_named_only_with_context_parallel():
    assert read(LLAMA70 + "--context-parallel-algo ulysses_cp_algo", 8).not_modelled == ()
    assert read(LLAMA70 + "--context-parallel-size 2 --context-parallel-algo ulysses_cp_algo", 8).not_modelled


# ---------------------------------------------------------------- the model of the command line
def test_model_from_the_script():
    m = model_from_megatron(shlex.split(LLAMA70)).spec
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab) == (80, 8192, 64, 8, 28672, 128256)
    assert (m.activation, m.norm, m.position, m.tied_embeddings, m.qkv_bias) == ("swiglu", "rmsnorm", "rope", False,
                                                                                False)


def test_megatron_defaults_where_flags_are_absent():
    """GPT-3 style: LayerNorm, learned positions, GeLU, tied embeddings, biases, ffn 4h; the GPT-2
    tokenizer's 50257 padded to a multiple of 128 x tp."""
    m = model_from_megatron(shlex.split("--num-layers 24 --hidden-size 1024 --num-attention-heads 16 "
                                        "--max-position-embeddings 1024 --tokenizer-type GPT2BPETokenizer "
                                        "--tensor-model-parallel-size 2")).spec
    assert (m.ffn_hidden, m.vocab, m.norm, m.position, m.max_positions) == (4096, 50432, "layernorm", "learned", 1024)
    assert (m.activation, m.tied_embeddings, m.qkv_bias, m.mlp_bias, m.kv_heads) == ("gelu", True, True, True, 16)


def test_swiglu_default_ffn():
    m = model_from_megatron(shlex.split("--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --swiglu "
                                        "--vocab-size 32000 --position-embedding-type rope")).spec
    assert m.ffn_hidden == 10880  # int(4h * 2/3 / 64) * 64


def test_deepseek_v3_from_the_script_is_the_preset():
    m = model_from_megatron(shlex.split(DSV3)).spec
    assert m.total_params() == load_model("deepseek-v3").total_params()
    assert (m.moe.first_dense_layers, m.mla.kv_lora_rank, m.mla.qk_rope_head_dim) == (3, 512, 64)


def test_moe_layer_pattern_and_mindspeed_minus_one():
    pattern = model_from_megatron(shlex.split(DSV3.replace("--first-k-dense-replace 3 --moe-layer-freq 1",
                                                           "--moe-layer-freq ([0]*3+[1]*58)"))).spec
    assert (pattern.moe.first_dense_layers, pattern.moe.layer_freq) == (3, 1)
    every = model_from_megatron(shlex.split(DSV3.replace("--first-k-dense-replace 3 --moe-layer-freq 1",
                                                         "--first-k-dense-replace -1 --moe-layer-freq -1"))).spec
    assert (every.moe.first_dense_layers, every.moe.layer_freq) == (0, 1)


def test_n_shared_experts_is_n_expert_widths():
    m = model_from_megatron(shlex.split(DSV3.replace("--moe-shared-expert-intermediate-size 2048",
                                                     "--n-shared-experts 2"))).spec
    assert (m.moe.shared_experts, m.moe.shared_ffn_hidden) == (1, 4096)


def test_vocabulary_only_in_the_tokenizer_is_named():
    r = model_from_megatron(shlex.split(LLAMA70.replace("--vocab-size 128256", "")
                                        + "--tokenizer-type PretrainedFromHF --tokenizer-name-or-path /m/llama3"))
    assert r.spec is None
    assert "tokenizer PretrainedFromHF at /m/llama3" in r.missing_vocab and "--model" in r.missing_vocab


def test_contradiction_is_one_line_naming_both_values():
    script = model_from_megatron(shlex.split(LLAMA70)).spec
    line = contradiction(load_model("llama2-7b"), script, "run.sh")
    assert line.count("\n") == 0 and "layers 32 (--model llama2-7b) vs 80 (the script)" in line
    assert "hidden 4096" in line and "kv_heads 32" in line and "vs 8 (the script)" in line
    assert contradiction(script, script, "run.sh") is None


def test_megatrons_deepseek_v3_layout_with_an_mtp_only_stage_is_a_valid_plan():
    """pipeline_parallel_layout.md's DeepSeek-V3 example: stage 30 holds only the MTP layer (no
    decoder layer); Megatron allows empty stages, and so does the plan check."""
    from partita.plan import check
    p = plan(DSV3 + "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --expert-model-parallel-size 32 "
             "--expert-tensor-parallel-size 1 --global-batch-size 64 --pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'", 512)
    assert p.layer_split == (3,) + (2,) * 29 + (0, 0) and p.vpp == 2
    assert check(p, load_model("deepseek-v3"), 512) is p


# ---------------------------------------------------------------- the commands (in-process)
LLAMA3_8B_SCRIPT = """#!/bin/bash
GPUS_PER_NODE=8
NNODES=2
ARGS=(--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32
      --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm --position-embedding-type rope
      --untie-embeddings-and-output-weights --disable-bias-linear --tokenizer-type NullTokenizer --vocab-size 128256
      --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer
      --micro-batch-size 1 --global-batch-size 64 --seq-length 4096 --bf16 --fp8-format hybrid --fp8-param-gather
      --optimizer-cpu-offload)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py "${ARGS[@]}"
"""
HW = ["--hardware", "h100-sxm", "--devices", "16"]


def _script(tmp_path, text: str = LLAMA3_8B_SCRIPT):
    path = tmp_path / "run.sh"
    path.write_text(text)
    return str(path)


def test_estimate_from_script_without_model_uses_the_scripts(tmp_path, capsys):
    """The script's model gives the estimate the preset of the same shape gives (llama3-8b)."""
    import json
    from partita.cli import main
    path = _script(tmp_path)
    results = []
    for model in ([], ["--model", "llama3-8b"]):
        assert main(["estimate", "--from-script", path, *HW, *model, "--json"]) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["step_time_s"] == results[1]["step_time_s"]
    assert results[0]["peak_memory_gib"] == results[1]["peak_memory_gib"]


def test_plan_from_script_without_model_is_not_the_default_model(tmp_path, capsys):
    from partita.cli import main
    assert main(["plan", "--from-script", _script(tmp_path), *HW, "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "your plan (dp4 tp2+sp pp2 z1" in out and "in the file, not modelled: --optimizer-cpu-offload" in out


def test_model_contradicting_the_script_is_one_line(tmp_path, capsys):
    from partita.cli import main
    assert main(["estimate", "--from-script", _script(tmp_path), *HW, "--model", "llama2-7b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "kv_heads 32 (--model llama2-7b) vs 8 (the script)" in err


def test_a_script_without_its_vocabulary_names_the_tokenizer(tmp_path, capsys):
    from partita.cli import main
    text = LLAMA3_8B_SCRIPT.replace("--tokenizer-type NullTokenizer --vocab-size 128256",
                                    "--tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-8B")
    assert main(["estimate", "--from-script", _script(tmp_path, text), *HW]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "tokenizer HuggingFaceTokenizer at meta-llama/Meta-Llama-3-8B" in err
    assert main(["estimate", "--from-script", _script(tmp_path, text), *HW, "--model", "llama3-8b"]) == 0


def test_estimate_needs_a_model_without_a_script(capsys):
    from partita.cli import main
    assert main(["estimate", *HW, "--tp", "2"]) == 2
    assert "--model is required" in capsys.readouterr().err


def test_import_json_has_the_model_and_the_flags_not_modelled_and_reads_as_a_plan(tmp_path, capsys):
    import json
    from partita.cli import main
    assert main(["import", _script(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["layers"] == 32 and out["model"]["kv_heads"] == 8
    assert [n.split(":")[0] for n in out["not_modelled"]] == ["--optimizer-cpu-offload"]
    assert out["fp8_param_gather"] is True
    (tmp_path / "plan.json").write_text(json.dumps(out))
    assert main(["estimate", "--plan", str(tmp_path / "plan.json"), "--model", "llama3-8b", *HW]) == 0


def test_estimate_without_devices_takes_the_scripts_world_or_names_the_flag(tmp_path, capsys):
    # issue 32: --devices is needed only where the file gives no world size (a ds_config), in one line
    import json
    from partita.cli import main
    assert main(["estimate", "--from-script", _script(tmp_path), "--hardware", "h100-sxm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["devices"] == 16  # GPUS_PER_NODE=8 x NNODES=2
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}))
    assert main(["estimate", "--from-script", str(ds), "--hardware", "h100-sxm", "--model", "llama3-8b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pass --devices" in err
    assert main(["estimate", "--model", "llama3-8b", "--hardware", "h100-sxm"]) == 2
    assert "--devices is required" in capsys.readouterr().err
