"""DeepSpeed-Chat's training scripts read as the ds_config its main.py builds (issue 33 survey,
docs/import_megatron.md "Second survey"). Snippets trimmed from deepspeedai/DeepSpeedExamples@45b4b71
(applications/DeepSpeed-Chat/training/..., path per case); expected values read by hand from that commit's
step1_supervised_finetuning/main.py parse_args defaults (per_device_train_batch_size 16, max_seq_len 512,
dtype fp16, zero_stage 0, lora_dim 0), main.py's train_batch_size = per-device x world x accumulation, and
dschat/utils/ds_utils.py get_train_ds_config. Before partita/imports/dschat.py each of these was "not a
recognised launch config"."""
from __future__ import annotations

from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.imports import load_config

HEAD = '''OUTPUT=$1
ZERO_STAGE=$2
if [ "$OUTPUT" == "" ]; then
    OUTPUT=./output
fi
if [ "$ZERO_STAGE" == "" ]; then
    ZERO_STAGE={default}
fi
mkdir -p $OUTPUT
'''
# step1_supervised_finetuning/training_scripts/opt/single_gpu/run_1.3b.sh (whole command)
SINGLE_GPU = HEAD.format(default=0) + r'''
deepspeed --num_gpus 1 main.py --model_name_or_path facebook/opt-1.3b \
   --gradient_accumulation_steps 8 --lora_dim 128 --zero_stage $ZERO_STAGE \
   --enable_tensorboard \
   --tensorboard_path $OUTPUT \
   --deepspeed --output_dir $OUTPUT &> $OUTPUT/training.log
'''
# step1_supervised_finetuning/training_scripts/llama2/run_llama2_7b_lora.sh (trimmed)
LLAMA2_LORA = HEAD.format(default=3) + r'''
deepspeed main.py \
   --data_path Dahoas/rm-static Dahoas/full-hh-rlhf \
   --data_split 2,4,4 \
   --model_name_or_path meta-llama/Llama-2-7b-hf \
   --per_device_train_batch_size 4 \
   --per_device_eval_batch_size 4 \
   --max_seq_len 512 \
   --gradient_accumulation_steps 1 \
   --gradient_checkpointing \
   --zero_stage $ZERO_STAGE \
   --deepspeed \
   --lora_dim 128 \
   --lora_module_name "layers." \
   --output_dir $OUTPUT \
   &> $OUTPUT/training.log
'''
# step3_rlhf_finetuning/training_scripts/opt/single_gpu/run_1.3b.sh (trimmed)
STEP3 = r'''
deepspeed --num_gpus 1 main.py --actor_model_name_or_path $ACTOR_MODEL_PATH --critic_model_name_or_path $CRITIC \
   --actor_zero_stage 0 --critic_zero_stage 0 \
   --num_padding_at_beginning 1 --gradient_accumulation_steps 2 \
   --deepspeed --actor_lora_dim 128 --enable_hybrid_engine --actor_gradient_checkpointing
'''


def _read(tmp_path: Path, text: str, where: str = "run.sh", **kw):
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return load_config(str(path), **kw)


def test_single_gpu_defaults_of_main_py(tmp_path):
    # e2e_rlhf.py runs `bash {script} {output_dir} {zero_stage}` with an empty zero stage: the script's own 0
    read = _read(tmp_path, SINGLE_GPU, args=["./out", ""])
    p = read.plan
    assert (p.dp, p.zero, p.dtype, p.seq_len) == (1, 0, "fp16", 512)  # --num_gpus 1; main.py defaults
    assert (p.mbs, p.gbs) == (16, 16 * 1 * 8)  # per_device_train_batch_size 16 x world 1 x accumulation 8
    assert p.recompute == "none" and p.finetune == "lora" and p.lora_rank == 128
    assert "facebook/opt-1.3b" in read.model_note
    assert any(n.startswith("--lora_dim without --only_optimize_lora") for n in read.not_modelled)


def test_llama2_lora_zero3_checkpointing_and_the_stage_named(tmp_path):
    read = _read(tmp_path, LLAMA2_LORA, "step2_dpo_finetuning/training_scripts/llama2/run.sh", args=["./o", ""],
                 devices=8)
    p = read.plan
    assert (p.dp, p.zero, p.mbs, p.gbs, p.seq_len) == (8, 3, 4, 32, 512)
    assert p.recompute == "full" and p.finetune == "lora"
    assert p.overlap_grad_reduce  # get_train_ds_config: "overlap_comm": True
    assert any(n.startswith("step2_dpo: DPO") for n in read.not_modelled)
    # the same file under step 1 names no stage
    again = _read(tmp_path, LLAMA2_LORA, "step1_supervised_finetuning/run.sh", args=["./o", ""], devices=8)
    assert not any(n.startswith("step2") for n in again.not_modelled)


def test_offload_and_dtype_reach_the_ds_config(tmp_path):
    text = LLAMA2_LORA.replace("--lora_dim 128 \\", "--offload --dtype bf16 \\")
    read = _read(tmp_path, text, args=["./o", "2"], devices=8)
    # get_train_ds_config with --offload: offload_optimizer on the cpu, no ratio (DeepSpeed's default 1.0: all of it)
    assert (read.plan.zero, read.plan.dtype, read.plan.finetune, read.plan.optimizer_offload) == (2, "bf16", "full", 1.0)
    assert not any(n.startswith("zero_optimization.offload_optimizer") for n in read.not_modelled)


@pytest.mark.parametrize("text, args, says", [
    (STEP3, [], "step 3 (RLHF"),
    (LLAMA2_LORA, [], "--args"),  # $2 unknown without the arguments e2e_rlhf.py passes
    (LLAMA2_LORA.replace("main.py", "main.py --dtype fp32"), ["./o", ""], "takes fp16 or bf16"),
])
def test_refusals_are_one_line(tmp_path, text, args, says):
    with pytest.raises(PartitaError) as e:
        _read(tmp_path, text, args=args, devices=8)
    assert says in str(e.value) and "\n" not in str(e.value)
