#!/bin/bash
# Phi-3.5-MoE on two 910B nodes: no --expert-tensor-parallel-size, so Megatron-Core splits experts tp ways.
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6001
NNODES=2
NODE_RANK=0

TP=4
PP=4
EP=1
MBS=1
GBS=64
SEQ_LEN=4096

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

MOE_ARGS="
    --expert-model-parallel-size ${EP} \
    --num-experts 16 \
    --moe-router-topk 2 \
    --moe-layer-freq -1 \
    --first-k-dense-replace -1 \
    --moe-router-load-balancing-type aux_loss
"

GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --num-layers-per-virtual-pipeline-stage 2 \
    --sequence-parallel \
    --use-flash-attn \
    --tokenizer-type PretrainedFromHF \
    --seq-length ${SEQ_LEN} \
    --max-position-embeddings 131072 \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 6400 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --padded-vocab-size 32064 \
    --make-vocab-size-divisible-by 1 \
    --add-qkv-bias \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --position-embedding-type rope \
    --normalization LayerNorm \
    --swiglu \
    --bf16
"

OPTIM_ARGS="
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather
"

TRAIN_ARGS="
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS}
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    $MOE_ARGS \
    $OPTIM_ARGS \
    $TRAIN_ARGS \
    --distributed-backend nccl
