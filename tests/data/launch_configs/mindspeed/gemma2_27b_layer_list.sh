#!/bin/bash
# Gemma2-27B on two 910B nodes: 46 layers over 2 stages, 20 and 26 (--num-layer-list).
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=2
NODE_RANK=0
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

TOKENIZER_MODEL="/data/gemma2-27b/tokenizer.model"
TP=8
PP=2

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --sequence-parallel \
    --use-fused-rmsnorm \
    --use-flash-attn \
    --gelu-tanh \
    --post-norm \
    --query-pre-attn-scalar 144 \
    --output-logit-softcapping 30.0 \
    --interleave-sliding-window 4096 \
    --num-layers 46 \
    --num-layer-list 20,26 \
    --hidden-size 4608 \
    --ffn-hidden-size 36864 \
    --num-attention-heads 32 \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path ${TOKENIZER_MODEL} \
    --seq-length 8192 \
    --max-position-embeddings 8192 \
    --micro-batch-size 1 \
    --global-batch-size 64 \
    --kv-channels 128 \
    --group-query-attention \
    --num-query-groups 16 \
    --make-vocab-size-divisible-by 1 \
    --disable-bias-linear \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --use-distributed-optimizer \
    --vocab-size 256000 \
    --bf16
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py $GPT_ARGS --distributed-backend nccl
