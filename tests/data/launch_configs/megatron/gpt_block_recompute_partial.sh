#!/bin/bash
# A 40-layer GPT on 4 nodes: 8 stages of 5 layers, the first 2 of each recomputed; context parallel 2.
GPUS_PER_NODE=8
NUM_NODES=4

GPT_MODEL_ARGS=(
    --num-layers 40
    --hidden-size 5120
    --ffn-hidden-size 13824
    --num-attention-heads 40
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 64
    --bf16
    --recompute-granularity full
    --recompute-method block
    --recompute-num-layers 2
    --use-distributed-optimizer
    --overlap-param-gather
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 2
    --pipeline-model-parallel-size 8
    --context-parallel-size 2
    --sequence-parallel
)

DATA_ARGS=(--tokenizer-type NullTokenizer --vocab-size 32000 --mock-data)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS[@]}
