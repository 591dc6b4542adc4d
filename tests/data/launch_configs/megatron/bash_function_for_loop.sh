#!/bin/bash
# Flags added by a shell function called with positional arguments, and by a for loop over a
# list; the node count from the script's first argument (--args 2).
# Exercises: name() { ...; }, "$1" inside a function, for x in ...; do ... done, break, ${1:-x}.

NNODES=${1:-1}
GPUS_PER_NODE=8

add_parallel() {
    MODEL_PARALLEL_ARGS+=(--tensor-model-parallel-size "$1" --pipeline-model-parallel-size "$2")
}

MODEL_PARALLEL_ARGS=()
add_parallel 4 2

TRAINING_ARGS=(--micro-batch-size 2 --global-batch-size 256)
for FLAG in --bf16 --use-distributed-optimizer --sequence-parallel STOP --fp16; do
    [ "$FLAG" = STOP ] && break
    TRAINING_ARGS+=("$FLAG")
done

MODEL_ARGS=(
    --num-layers 40
    --hidden-size 5120
    --ffn-hidden-size 13824
    --num-attention-heads 40
    --seq-length 4096
    --max-position-embeddings 4096
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --disable-bias-linear
)

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${TRAINING_ARGS[@]} \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 32000
