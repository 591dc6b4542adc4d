#!/bin/bash
# A MindSpeed-LLM run that first sources the CANN environment (a file on the Ascend machine, not
# here: read without it, named in the reading), finds its own directory, and lowercases a mode.
# Exercises: source of a missing file, $(cd "$(dirname "$0")" && pwd), ${VAR,,}, [[ == ]], export.
source /usr/local/Ascend/ascend-toolkit/set_env.sh
export CUDA_DEVICE_MAX_CONNECTIONS=1
export HCCL_CONNECT_TIMEOUT=1200

SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd)
RECOMPUTE_MODE=${RECOMPUTE_MODE:-"FULL"}

NPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=2
NODE_RANK=0
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

TP=4
PP=2

RECOMPUTE_ARGS=""
if [[ "${RECOMPUTE_MODE,,}" == "full" ]]; then
    RECOMPUTE_ARGS="--recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
fi

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
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 11008 \
    --num-attention-heads 32 \
    --seq-length 4096 \
    --max-position-embeddings 4096 \
    --micro-batch-size 1 \
    --global-batch-size 256 \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 32000 \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path ${SCRIPT_DIR}/tokenizer \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --use-fused-rmsnorm \
    --swiglu \
    --use-fused-swiglu \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --use-distributed-optimizer \
    --lr 1.25e-6 \
    --train-iters 2000 \
    --bf16
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    $RECOMPUTE_ARGS \
    --data-path "your data path" \
    --distributed-backend nccl \
    | tee logs/train_llama2_7b.log
