#!/bin/bash
# Qwen2-1.5B at tp 1: SP=true but tp 1, so neither branch sets sp_options and the command line carries
# an empty ${sp_options} right after a switch flag (--use-distributed-optimizer); bash drops it.
ENV=$1
if [ $ENV = dsw ]; then
    GPUS_PER_NODE=8
    NNODES=1
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
PR=$6
TP=$7
PP=$8
SP=$9
DO=${10}

if [ $MODEL_SIZE = 1.5B ]; then
    NUM_LAYERS=28
    HIDDEN_SIZE=1536
    NUM_ATTN_HEADS=12
    INTERMEDIATE_SIZE=8960
    NUM_KEY_VALUE_HEADS=2
    EXTRA_VOCAB_SIZE=293
    tie_option=""
elif [ $MODEL_SIZE = 7B ]; then
    NUM_LAYERS=28
    HIDDEN_SIZE=3584
    NUM_ATTN_HEADS=28
    INTERMEDIATE_SIZE=18944
    NUM_KEY_VALUE_HEADS=4
    EXTRA_VOCAB_SIZE=421
    tie_option="--untie-embeddings-and-output-weights"
fi

if [ $PR = fp16 ]; then
    pr_options="--fp16 --apply-query-key-layer-scaling"
elif [ $PR = bf16 ]; then
    pr_options="--bf16"
fi

if [ $DO = true ]; then
    do_options="--use-distributed-optimizer"
elif [ $DO = false ]; then
    do_options=""
fi

if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_options="--sequence-parallel"
elif [ $SP = false ]; then
    sp_options=""
fi

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_qwen.py \
    --micro-batch-size ${BATCH_SIZE} \
    --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers ${NUM_LAYERS} \
    --hidden-size ${HIDDEN_SIZE} \
    --num-attention-heads ${NUM_ATTN_HEADS} \
    --ffn-hidden-size ${INTERMEDIATE_SIZE} \
    --seq-length ${SEQ_LEN} \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --extra-vocab-size ${EXTRA_VOCAB_SIZE} \
    --padded-vocab-size 151936 \
    --patch-tokenizer-type Qwen2Tokenizer \
    --swiglu \
    --normalization RMSNorm \
    --position-embedding-type rope \
    --add-qkv-bias \
    --disable-bias-linear \
    --group-query-attention \
    --num-query-groups ${NUM_KEY_VALUE_HEADS} \
    ${pr_options} ${do_options} ${sp_options} ${tie_option}
