#!/bin/bash
# Qwen2.5-32B full fine-tune over 16 pipeline stages on two nodes of 8 (msrun), the fp32 master
# weights reused (--reuse-fp32-param) and batches padded to their longest sample
# (--variable-seq-lengths, --padded-samples). Follows the public script named in the .expected.json.
# Exercises: $1/$2 left unset, WORLD_SIZE=$((..)), msrun, a TUNE_ARGS string.
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True

NPUS_PER_NODE=8
MASTER_ADDR=$1
MASTER_PORT=6000
NNODES=2
NODE_RANK=$2
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

TP=1
PP=16
SEQ_LEN=4096
MBS=1
GBS=32

DISTRIBUTED_ARGS="
    --local_worker_num $NPUS_PER_NODE \
    --worker_num $WORLD_SIZE \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT \
    --join False
"

TUNE_ARGS="
    --finetune \
    --stage sft \
    --is-instruction-dataset \
    --prompt-type qwen \
    --padded-samples \
    --variable-seq-lengths
"

GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --num-layers 64 \
    --reuse-fp32-param \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --hidden-size 5120 \
    --ffn-hidden-size 27648 \
    --num-attention-heads 40 \
    --seq-length ${SEQ_LEN} \
    --max-position-embeddings ${SEQ_LEN} \
    --disable-bias-linear \
    --add-qkv-bias \
    --group-query-attention \
    --num-query-groups 8 \
    --use-flash-attn \
    --swiglu \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --untie-embeddings-and-output-weights \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 152064 \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --bf16
"

msrun $DISTRIBUTED_ARGS posttrain_gpt.py \
    $TUNE_ARGS \
    $GPT_ARGS \
    --data-path "your data path" \
    --ai-framework mindspore \
    | tee logs/tune_qwen25_32b.log
