#!/bin/bash
# Llama-3.1-8B on one DSW node: full recompute whose layer count comes from the environment (MP_AC_LAYERS,
# defaulted with an `if [ -z ... ]`), a divisibility check that exits, and eval of the built command line.
set -e
ENV=$1
if [ $ENV = dsw ]; then
    MASTER_ADDR=localhost
    NNODES=1
    NODE_RANK=0
    GPUS_PER_NODE=8
fi
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR"
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
TP=$6
PP=$7
AC=$8

if [ $MODEL_SIZE = 8B ]; then
    NUM_LAYERS=32
    HIDDEN_SIZE=4096
    NUM_ATTN_HEADS=32
    INTERMEDIATE_SIZE=14336
    NUM_KEY_VALUE_HEADS=8
    gqa_options=" \
        --group-query-attention \
        --num-query-groups ${NUM_KEY_VALUE_HEADS}"
elif [ $MODEL_SIZE = 70B ]; then
    NUM_LAYERS=80
    HIDDEN_SIZE=8192
    NUM_ATTN_HEADS=64
    INTERMEDIATE_SIZE=28672
    NUM_KEY_VALUE_HEADS=8
fi

if [ -z ${MP_AC_LAYERS} ]; then
    MP_AC_LAYERS=1
fi

if [ $AC = full ]; then
    _check=$(( ($NUM_LAYERS / $PP) % ${MP_AC_LAYERS} ))
    if [ $_check != 0 ]; then
        echo "the num layers per pp rank must be a multiple of the recompute layers."
        exit -1
    fi
    activation_checkpoint_options=" \
        --recompute-method uniform \
        --recompute-num-layers ${MP_AC_LAYERS} \
        --recompute-granularity full"
elif [ $AC = none ]; then
    activation_checkpoint_options=" \
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
    --max-position-embeddings 131072 \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --padded-vocab-size 128256 \
    --patch-tokenizer-type LLama3Tokenizer \
    --swiglu \
    --normalization RMSNorm \
    --use-rotary-position-embeddings \
    --position-embedding-type rope \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --bf16 \
    --use-distributed-optimizer \
    --sequence-parallel"

run_cmd="torchrun $DISTRIBUTED_ARGS pretrain_llama.py ${megatron_options} ${activation_checkpoint_options} ${gqa_options}"
eval ${run_cmd}
