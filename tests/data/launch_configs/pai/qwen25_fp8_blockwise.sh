#!/bin/bash
# Qwen2.5-14B with PR=fp8: the precision branch adds --bf16 --fp8-format hybrid --fp8-recipe blockwise;
# ${VAR:-default} for the node count; the launcher's arguments kept in a string.
ENV=${1:-dsw}
NNODES=${NNODES:-1}
GPUS_PER_NODE=8
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES"
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
PR=$6
TP=$7
PP=$8
CP=$9

case $MODEL_SIZE in
    14B)
        NUM_LAYERS=48; HIDDEN_SIZE=5120; NUM_ATTN_HEADS=40; INTERMEDIATE_SIZE=13824; NUM_KEY_VALUE_HEADS=8 ;;
    32B)
        NUM_LAYERS=64; HIDDEN_SIZE=5120; NUM_ATTN_HEADS=40; INTERMEDIATE_SIZE=27648; NUM_KEY_VALUE_HEADS=8 ;;
esac

if [ $PR = fp16 ]; then
    pr_options=" \
        --fp16 \
        --apply-query-key-layer-scaling"
elif [ $PR = bf16 ]; then
    pr_options=" \
        --bf16"
elif [ $PR = fp8 ]; then
    pr_options=" \
        --bf16 \
        --fp8-format hybrid \
        --fp8-recipe blockwise"
fi

torchrun $DISTRIBUTED_ARGS pretrain_qwen.py \
    --micro-batch-size ${BATCH_SIZE} \
    --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers ${NUM_LAYERS} \
    --hidden-size ${HIDDEN_SIZE} \
    --num-attention-heads ${NUM_ATTN_HEADS} \
    --ffn-hidden-size ${INTERMEDIATE_SIZE} \
    --seq-length ${SEQ_LEN} \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --padded-vocab-size 152064 \
    --swiglu \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --add-qkv-bias \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --group-query-attention \
    --num-query-groups ${NUM_KEY_VALUE_HEADS} \
    --use-distributed-optimizer \
    --sequence-parallel \
    ${pr_options}
