#!/bin/bash
# Defaults assigned in place (: ${VAR:=x}), filled by a test-and-assign ([ -z ] && X=...), and a
# flag chosen by && / || on the node count (--env NNODES=1 would drop --overlap-grad-reduce).
# Exercises: : ${VAR:=x}, : "${VAR:=$((...))}", [ -z "$X" ] && X=..., [[ -gt ]] && ... || ..., +=.

export CUDA_DEVICE_MAX_CONNECTIONS=1

: ${NNODES:=2}
: ${TP:=2}
: "${PP:=2}"
MBS=1
: "${GBS:=$((MBS * 64))}"
CP=""
[ -z "$CP" ] && CP=2

EXTRA=()
[[ $NNODES -gt 1 ]] && EXTRA+=(--overlap-grad-reduce) || EXTRA+=(--no-gradient-accumulation-fusion)

GPT_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size $PP
    --context-parallel-size $CP
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 8192
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --micro-batch-size $MBS
    --global-batch-size $GBS
    --bf16
    --use-distributed-optimizer
)

torchrun --nproc_per_node 8 --nnodes $NNODES --node_rank ${NODE_RANK:-0} pretrain_gpt.py \
    "${GPT_ARGS[@]}" "${EXTRA[@]}" \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128256
