#!/bin/bash
# Qwen3-8B, 32K sequences with context parallelism 2 and tp 2 on one node: dp = 8 / (tp 2 x cp 2) = 2.
# The option strings are appended one after another (opts="$opts ..."), as the README's variants do.
ENV=$1
GPUS_PER_NODE=8
NNODES=1
BATCH_SIZE=$2
GLOBAL_BATCH_SIZE=$3
SEQ_LEN=$4
TP=$5
PP=$6
CP=$7

opts="--micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE}"
opts="$opts --num-layers 36 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 12288"
opts="$opts --group-query-attention --num-query-groups 8 --kv-channels 128 --qk-layernorm"
opts="$opts --seq-length ${SEQ_LEN} --max-position-embeddings 40960"
opts="$opts --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} --context-parallel-size ${CP}"
opts="$opts --padded-vocab-size 151936 --swiglu --normalization RMSNorm --position-embedding-type rope"
opts="$opts --disable-bias-linear --untie-embeddings-and-output-weights --bf16 --use-distributed-optimizer"
if [ $TP -gt 1 ]; then
    opts="$opts --sequence-parallel"
fi

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_qwen.py $opts
