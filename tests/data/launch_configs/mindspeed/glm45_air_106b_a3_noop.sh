#!/bin/bash
# GLM-4.5-Air on 8 A3 nodes: noop layers at 1 and 47 even out the 4 pipeline stages.
export CUDA_DEVICE_MAX_CONNECTIONS=1
export HCCL_CONNECT_TIMEOUT=1800

NPUS_PER_NODE=16
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=8
NODE_RANK=0

TP=1
PP=4
EP=16

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

MOE_ARGS="
    --first-k-dense-replace 1 \
    --moe-layer-freq 1 \
    --n-shared-experts 1 \
    --num-experts 128 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 1408 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall \
    --moe-router-score-function sigmoid
"

GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --expert-model-parallel-size ${EP} \
    --recompute-method uniform \
    --recompute-granularity full \
    --recompute-num-layers 1 \
    --noop-layers 1,47 \
    --sequence-parallel \
    --mtp-num-layers 1 \
    --kv-channels 128 \
    --use-flash-attn \
    --overlap-grad-reduce \
    --use-distributed-optimizer \
    --num-layers 48 \
    --hidden-size 4096 \
    --ffn-hidden-size 10944 \
    --num-attention-heads 96 \
    --seq-length 4096 \
    --micro-batch-size 1 \
    --global-batch-size 64 \
    --max-position-embeddings 131072 \
    --padded-vocab-size 151552 \
    --make-vocab-size-divisible-by 1 \
    --group-query-attention \
    --num-query-groups 8 \
    --disable-bias-linear \
    --add-qkv-bias \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --tokenizer-type PretrainedFromHF \
    --untie-embeddings-and-output-weights \
    --bf16
"

torchrun ${DISTRIBUTED_ARGS} pretrain_gpt.py \
    $GPT_ARGS \
    $MOE_ARGS \
    --distributed-backend nccl
