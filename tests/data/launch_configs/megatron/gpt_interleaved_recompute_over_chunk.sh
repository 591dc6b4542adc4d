#!/bin/bash
# A 48-layer GPT on 2 nodes: interleaved pipeline of 4-layer chunks, block recompute of 8 layers
# (more than a chunk holds: Megatron recomputes every layer).
GPUS_PER_NODE=8
NNODES=2
WORLD_SIZE=$((GPUS_PER_NODE * NNODES))

TP=2
PP=4
CHUNK=4

ARGS=(--tensor-model-parallel-size $TP --pipeline-model-parallel-size $PP)
ARGS+=(--num-layers-per-virtual-pipeline-stage $CHUNK)
ARGS+=(--num-layers 48 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096)
ARGS+=(--swiglu --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights)
ARGS+=(--disable-bias-linear --tokenizer-type NullTokenizer --vocab-size 32000)
ARGS+=(--micro-batch-size 2 --global-batch-size 512 --bf16 --sequence-parallel --use-distributed-optimizer)
ARGS+=(--recompute-granularity full --recompute-method block --recompute-num-layers 8)
ARGS+=(--tp-comm-overlap --overlap-grad-reduce)

torchrun --nproc_per_node=$GPUS_PER_NODE --nnodes=$NNODES pretrain_gpt.py "${ARGS[@]}"
