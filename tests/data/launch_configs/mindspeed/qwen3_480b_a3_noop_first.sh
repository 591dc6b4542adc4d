#!/bin/bash
# Qwen3-Coder-480B on 16 A3 nodes: noop layers 0 and 63, virtual stages of 2 layers, swapped attention and optimizer.
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS_PER_NODE=16
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=16
NODE_RANK=0

TP=4
PP=4
VPP=2
EP=32
CP=1
MBS=1
GBS=64
CP_TYPE='megatron_cp_algo'
SEQ_LENGTH=4096

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

RECOMPUTE_ARGS="
    --recompute-granularity full \
    --recompute-method uniform \
    --recompute-num-layers 1
"

MOE_ARGS="
    --num-experts 160 \
    --moe-router-topk 8 \
    --moe-ffn-hidden-size 2560 \
    --moe-layer-freq -1 \
    --first-k-dense-replace -1 \
    --moe-grouped-gemm \
    --moe-alltoall-overlap-comm \
    --moe-token-dispatcher-type alltoall
"

OPTIMIZE_ARGS="
    --use-flash-attn \
    --use-rotary-position-embeddings \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --swap-attention \
    --swap-optimizer
"

MODEL_PARALLEL_ARGS="
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --expert-model-parallel-size ${EP} \
    --context-parallel-size ${CP} \
    --context-parallel-algo ${CP_TYPE} \
    --expert-tensor-parallel-size 1 \
    --sequence-parallel \
    --num-layers-per-virtual-pipeline-stage ${VPP}
"

TRAIN_ARGS="
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --bf16 \
    --seq-length ${SEQ_LENGTH}
"

GPT_ARGS="
    --use-mcore-models \
    --kv-channels 128 \
    --qk-layernorm \
    --max-position-embeddings ${SEQ_LENGTH} \
    --num-layers 64 \
    --noop-layers 0,63 \
    --hidden-size 6144 \
    --ffn-hidden-size 8192 \
    --num-attention-heads 96 \
    --tokenizer-type PretrainedFromHF \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 151936 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --group-query-attention \
    --num-query-groups 8
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    $RECOMPUTE_ARGS \
    $MOE_ARGS \
    $OPTIMIZE_ARGS \
    $TRAIN_ARGS \
    $MODEL_PARALLEL_ARGS \
    --distributed-backend nccl
