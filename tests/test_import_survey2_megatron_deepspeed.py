"""Megatron-DeepSpeed launch scripts read as the fork runs them (issue 33 survey, docs/import_megatron.md
"Second survey"). Snippets trimmed from microsoft/Megatron-DeepSpeed@f4157be (path given per test); the
expected values read by hand from that commit's megatron/arguments.py and megatron/model/transformer.py
(line numbers in partita/imports/megatron_deepspeed.py), and the MoE size from the DeepSpeed-MoE paper.
Each case failed on the reader before the fork was recognised (zero 0, MHA, no cp, no experts)."""
from __future__ import annotations

from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.imports import load_config

# examples_deepspeed/universal_checkpointing/megatron_gpt/run_bf16.sh (DEBUG_MODE=1 branch, trimmed)
RUN_BF16 = r'''
DIR=`pwd`
CONFIG_JSON="$script_dir/ds_config.json"
ZERO_STAGE=1
DTYPE="bf16"
LAYERS=4
HIDDEN=512
SEQ=512
TP=2
PP=2
DP=2
SP=1
WORLD_SIZE=$((TP*PP*DP*SP))
GLOBAL_BATCH=16
MICRO_BATCH=$((GLOBAL_BATCH/WORLD_SIZE))
options=" \
	--tensor-model-parallel-size $TP \
	--pipeline-model-parallel-size $PP \
	--ds-sequence-parallel-size $SP \
        --num-layers $LAYERS \
        --hidden-size $HIDDEN \
        --num-attention-heads 32 \
        --seq-length $SEQ \
        --max-position-embeddings $SEQ \
	--micro-batch-size $MICRO_BATCH \
	--global-batch-size $GLOBAL_BATCH \
	--vocab-file dataset/gpt2-vocab.json \
	--merge-file dataset/gpt2-merges.txt \
        --${DTYPE} \
	--checkpoint-activations \
        --make-vocab-size-divisible-by 256
        "
options="${options} \
        --deepspeed \
        --deepspeed_config=${CONFIG_JSON} \
        --zero-stage=${ZERO_STAGE} \
        --deepspeed-activation-checkpointing \
"
if [[ ${ZERO_STAGE} -gt 1 ]]; then
options="${options} \
    --no-pipeline-parallel"
fi
WORKER_STR="--num_nodes 1 --num_gpus $WORLD_SIZE"
run_cmd="deepspeed --master_port 29700 $WORKER_STR ${DIR}/pretrain_gpt.py $@ ${options}"
eval ${run_cmd}
'''

# examples_deepspeed/pretrain_llama2_distributed.sh (trimmed; --padded-vocab-size 32000 added: the file
# leaves the vocabulary to its tokenizer.model, Llama-2's 32000 tokens)
LLAMA2 = r'''
TP=2
PP=2
ZERO_STAGE=0
GPUS_PER_NODE=8
NNODES=1
HIDDEN_SIZE=2048
FFN_HIDDEN_SIZE=5504
NUM_LAYERS=24
NUM_HEADS=16
SEQ_LENGTH=2048
NUM_KV_HEADS=4
MICRO_BATCH_SIZE=4
GLOBAL_BATCH_SIZE=32
ds_args=""
ds_args=" --deepspeed ${ds_args}"
ds_args=" --deepspeed_config=$DS_CONFIG ${ds_args}"
ds_args=" --zero-stage=$ZERO_STAGE ${ds_args}"
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES"
torchrun $DISTRIBUTED_ARGS \
       pretrain_gpt.py \
       --tensor-model-parallel-size $TP \
       --pipeline-model-parallel-size $PP \
       --num-layers $NUM_LAYERS \
       --hidden-size $HIDDEN_SIZE \
       --ffn-hidden-size $FFN_HIDDEN_SIZE \
       --num-attention-heads $NUM_HEADS \
       --micro-batch-size $MICRO_BATCH_SIZE \
       --global-batch-size $GLOBAL_BATCH_SIZE \
       --seq-length $SEQ_LENGTH \
       --max-position-embeddings $SEQ_LENGTH \
       --padded-vocab-size 32000 \
       --bf16 \
       --use-rotary-position-embeddings \
       --untie-embeddings-and-output-weights \
       --swiglu \
       --normalization rmsnorm \
       --disable-bias-linear \
       --num-key-value-heads $NUM_KV_HEADS \
       $ds_args
'''

# examples_deepspeed/MoE/ds_pretrain_gpt_1.3B_MoE128.sh (trimmed): "1.3B+MoE-128", 52B parameters in
# the DeepSpeed-MoE paper (Rajbhandari et al. 2022, arXiv:2201.05596, Table 1)
MOE128 = r'''
SEQ_LEN=2048
NUM_LAYERS=24
HIDDEN_SIZE=2048
NUM_ATTN_HEADS=16
GLOBAL_BATCH_SIZE=512
BATCH_SIZE=8
MP_SIZE=1
PP_SIZE=1
NUM_GPUS=64
EP_SIZE=128
if [[ $EP_SIZE -gt $NUM_GPUS ]]; then
    EP_PARALLEL_SIZE=$NUM_GPUS
else
    EP_PARALLEL_SIZE=$EP_SIZE
fi
megatron_options=" \
        --tensor-model-parallel-size ${MP_SIZE} \
        --moe-expert-parallel-size ${EP_PARALLEL_SIZE} \
        --num-experts ${EP_SIZE} \
        --moe-train-capacity-factor 1.0 \
        --micro-batch-size ${BATCH_SIZE} \
        --global-batch-size ${GLOBAL_BATCH_SIZE} \
        --num-layers ${NUM_LAYERS} \
        --hidden-size ${HIDDEN_SIZE} \
        --num-attention-heads ${NUM_ATTN_HEADS} \
        --seq-length ${SEQ_LEN} \
        --max-position-embeddings ${SEQ_LEN} \
        --vocab-file gpt2-vocab.json \
        --merge-file gpt2-merges.txt \
        --fp16 \
        --checkpoint-activations"
deepspeed_options=" \
		    --deepspeed \
		    --deepspeed_config ds_config_gpt.json \
		    --pipeline-model-parallel-size ${PP_SIZE}"
run_cmd="deepspeed ${DIR}/../../pretrain_gpt.py ${megatron_options} ${deepspeed_options}"
eval ${run_cmd}
'''

# examples_deepspeed/sequence_parallel/ds_pretrain_gpt_30B_seq_parallel_32k.sh (trimmed)
ULYSSES = r'''
seq_len=32768
num_layers=64
hidden_size=6144
num_attn_heads=64
global_batch_size=2
batch_size=1
zero_stage=3
mp_size=1
pp_size=1
sp_size=4
megatron_options=" \
    --tensor-model-parallel-size ${mp_size} \
    --ds-sequence-parallel-size ${sp_size} \
    --micro-batch-size ${batch_size} \
    --global-batch-size ${global_batch_size} \
    --num-layers ${num_layers} \
    --hidden-size ${hidden_size} \
    --num-attention-heads ${num_attn_heads} \
    --seq-length ${seq_len} \
    --max-position-embeddings ${seq_len} \
    --vocab-file gpt2-vocab.json \
    --merge-file gpt2-merges.txt \
    --use-flash-attn-triton \
    --fp16 \
    --checkpoint-activations"
deepspeed_options=" \
    --deepspeed \
    --deepspeed_config ds_config.json \
    --zero-stage ${zero_stage} \
    --pipeline-model-parallel-size ${pp_size} \
    --no-pipeline-parallel"
deepspeed ${dir}/../../pretrain_gpt.py ${megatron_options} ${deepspeed_options}
'''


def _read(tmp_path: Path, text: str, devices: int | None = None, **kw):
    path = tmp_path / "run.sh"
    path.write_text(text)
    return load_config(str(path), devices=devices, **kw)


def test_zero_is_deepspeeds_stage_and_attention_unfused_without_flash(tmp_path):
    read = _read(tmp_path, RUN_BF16)
    p = read.plan
    # deepspeed --num_gpus $((2*2*2*1)); dp = world / (tp * pp * ds_sp) (arguments.py l.101-108)
    assert (p.dp, p.tp, p.pp, p.cp) == (2, 2, 2, 1)
    assert p.zero == 1  # --zero-stage=1 (the Megatron-LM reading: 0, no --use-distributed-optimizer)
    assert p.framework == "deepspeed" and read.framework == "megatron"  # DeepSpeed's engine; the --from name
    assert (p.mbs, p.gbs, p.seq_len, p.dtype) == (2, 16, 512, "bf16")
    assert p.recompute == "full"  # --checkpoint-activations
    assert p.attention == "unfused"  # no --use-flash-attn*: CoreAttention (transformer.py l.528-531)
    assert read.model is not None and read.model.heads == 32 and read.model.layers == 4
    assert not any("zero" in n.lower() for n in read.not_modelled)


def test_num_key_value_heads_is_grouped_query_attention(tmp_path):
    read = _read(tmp_path, LLAMA2)
    p, m = read.plan, read.model
    assert (p.dp, p.tp, p.pp, p.zero, p.mbs, p.gbs) == (2, 2, 2, 0, 4, 32)
    assert m is not None and (m.heads, m.kv_heads) == (16, 4)  # arguments.py l.623, l.444
    assert (m.hidden, m.ffn_hidden, m.layers, m.position) == (2048, 5504, 24, "rope")


def test_deepspeed_moe_list_interval_and_top1(tmp_path):
    read = _read(tmp_path, MOE128, devices=64)
    p, m = read.plan, read.model
    assert (p.dp, p.ep, p.zero, p.mbs, p.gbs, p.dtype) == (64, 64, 0, 8, 512, "fp16")
    # MoE at 1-based layers divisible by --expert-interval 2 (get_num_experts_per_layer), top-1 (--topk 1)
    assert m.moe.num_experts == 128 and m.moe.top_k == 1 and m.moe_layers == 12
    assert m.moe_flags[:4] == (False, True, False, True)
    assert abs(m.total_params() / 52e9 - 1) < 0.02  # "1.3B+MoE-128": 52B (arXiv:2201.05596 Table 1)
    notes = " ".join(read.not_modelled)
    assert "--zero-stage" in notes and "--moe-train-capacity-factor" in notes


def test_ulysses_is_context_parallel_named(tmp_path):
    read = _read(tmp_path, ULYSSES, devices=8)
    p = read.plan
    assert (p.dp, p.tp, p.pp, p.cp, p.zero, p.seq_len) == (2, 1, 1, 4, 3, 32768)
    assert p.attention == "fused"  # --use-flash-attn-triton
    assert any(n.startswith("--ds-sequence-parallel-size") for n in read.not_modelled)


@pytest.mark.parametrize("edit, says", [
    (("--num-experts ${EP_SIZE}", "--num-experts 64 64 64 64 64 64 64 64 64 64 128 128"), "pyramid"),
    (("--num-experts ${EP_SIZE}", "--num-experts ${EP_SIZE} --mlp-type residual"), "--mlp-type residual"),
    (("--deepspeed \\", "--deepspeed --zero-stage ${stage} \\"), "--env stage="),
])
def test_what_is_not_read_is_one_line(tmp_path, edit, says):
    with pytest.raises(PartitaError) as e:
        _read(tmp_path, MOE128.replace(*edit), devices=64)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_zbh1_pipeline_is_the_zero_bubble_schedule(tmp_path):
    # examples_deepspeed/zero_bubble_pp/zbh1_pretrain_gpt_1.3b.sh passes --enable-zbh1-pipeline (arguments.py
    # l.856); ZB-H1 is what Partita's zero-bubble prices (a third of the 1F1B bubble, cost/pipeline.py)
    text = RUN_BF16.replace("--deepspeed-activation-checkpointing \\", "--enable-zbh1-pipeline \\")
    assert _read(tmp_path, text).plan.schedule == "zero-bubble"
    assert _read(tmp_path, RUN_BF16).plan.schedule == "1f1b"
