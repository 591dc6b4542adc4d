#!/bin/bash
# Mistral-7B with an interleaved pipeline whose chunk size comes from the environment (MP_VP), the option
# string empty when it is unset; `sh run.sh dsw 7B ...` with positional arguments.
ENV=$1
if [ $ENV = dsw ]; then
    GPUS_PER_NODE=8
    NNODES=1
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
TP=$6
PP=$7
SP=$8

if [ $MODEL_SIZE = 7B ]; then
    NUM_LAYERS=32
    HIDDEN_SIZE=4096
    NUM_ATTN_HEADS=32
    INTERMEDIATE_SIZE=14336
    NUM_KEY_VALUE_HEADS=8
fi

if [ -z ${MP_VP} ]; then
    vp_options=""
else
    vp_options=" \
        --num-layers-per-virtual-pipeline-stage ${MP_VP}"
fi

if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_options=" \
        --sequence-parallel"
elif [ $SP = false ]; then
    sp_options=" \
        "
fi

megatron_options=" \
    --micro-batch-size ${BATCH_SIZE} \
    --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers ${NUM_LAYERS} \
    --hidden-size ${HIDDEN_SIZE} \
    --num-attention-heads ${NUM_ATTN_HEADS} \
    --ffn-hidden-size ${INTERMEDIATE_SIZE} \
    --seq-length ${SEQ_LEN} \
    --max-position-embeddings 32768 \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --padded-vocab-size 32000 \
    --patch-tokenizer-type MistralTokenizer \
    --swiglu \
    --normalization RMSNorm \
    --use-rotary-position-embeddings \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --group-query-attention \
    --num-query-groups ${NUM_KEY_VALUE_HEADS} \
    --bf16 \
    --use-distributed-optimizer"

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_mcore_mistral.py ${megatron_options} ${vp_options} ${sp_options}
