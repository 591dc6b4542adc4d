#!/bin/bash
# A MoE model whose parallel sizes come from the environment with defaults (--env PP=4 overrides
# the 8 written here), flags appended to one string with +=, block recompute of 2 layers per stage.
# Exercises: ${VAR:-x} overridden by --env, X+=" ...", $((...)), export.
export CUDA_DEVICE_MAX_CONNECTIONS=1
export HCCL_CONNECT_TIMEOUT=1200

NPUS_PER_NODE=8
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=${NNODES:-2}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

TP=${TP:-2}
PP=${PP:-8}
EP=${EP:-2}
SEQ_LENGTH=${SEQ_LENGTH:-4096}

DISTRIBUTED_ARGS="--nproc_per_node $NPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

GPT_ARGS="--use-mcore-models --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP}"
GPT_ARGS+=" --expert-model-parallel-size ${EP} --sequence-parallel"
GPT_ARGS+=" --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32"
GPT_ARGS+=" --group-query-attention --num-query-groups 8 --seq-length ${SEQ_LENGTH}"
GPT_ARGS+=" --max-position-embeddings 32768 --position-embedding-type rope --normalization RMSNorm"
GPT_ARGS+=" --use-fused-rmsnorm --swiglu --use-fused-swiglu --disable-bias-linear"
GPT_ARGS+=" --num-experts 8 --moe-router-topk 2 --moe-grouped-gemm --moe-token-dispatcher-type alltoall"
GPT_ARGS+=" --micro-batch-size 1 --global-batch-size 128 --use-distributed-optimizer --bf16"
GPT_ARGS+=" --recompute-granularity full --recompute-method block --recompute-num-layers 2"
GPT_ARGS+=" --swap-optimizer"  # as the public file: the optimizer states live on the host between steps
GPT_ARGS+=" --padded-vocab-size 32000 --make-vocab-size-divisible-by 1 --tokenizer-type PretrainedFromHF"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py $GPT_ARGS \
    --data-path "your data path" --tokenizer-name-or-path "your tokenizer path" \
    --distributed-backend nccl | tee logs/pretrain_moe.log
