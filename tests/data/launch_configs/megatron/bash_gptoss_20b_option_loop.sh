#!/bin/bash
# gpt-oss-20b style MoE, options parsed by a while/case/shift loop over "$@" (pass them with
# --args '--checkpoint-path /ckpt --tp 2 --ep 4'); the rest ${VAR:-x} defaults.
# Exercises: while [[ $# -gt 0 ]], case $1 in a|b), shift 2, exit in a branch not taken, $((...)).

export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

CHECKPOINT_PATH="NO_VALUE_PROVIDED"
TOKENIZER_ARG="MOCK"
TP_SIZE=1
EP_SIZE=1

while [[ $# -gt 0 ]]; do
    case $1 in
        --checkpoint-path)
            CHECKPOINT_PATH="$2"
            shift 2
            ;;
        --tokenizer)
            TOKENIZER_ARG="$2"
            shift 2
            ;;
        --tp)
            TP_SIZE="$2"
            shift 2
            ;;
        --ep)
            EP_SIZE="$2"
            shift 2
            ;;
        -h|--help)
            echo "Usage: $0 [OPTIONS]"
            exit 0
            ;;
        *)
            echo "Unknown option: $1"
            exit 1
            ;;
    esac
done

GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NUM_NODES=${NUM_NODES:-1}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
    --node_rank $NODE_RANK
)

MODEL_ARGS=(
    --num-layers 24
    --hidden-size 2880
    --ffn-hidden-size 2880
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --kv-channels 64
    --seq-length 4096
    --max-position-embeddings 4096
    --position-embedding-type rope
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
)

MOE_ARGS=(
    --num-experts 32
    --moe-router-topk 4
    --moe-ffn-hidden-size 2880
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 64
    --train-iters 1000
    --bf16
    --use-distributed-optimizer
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --expert-model-parallel-size $EP_SIZE
    --pipeline-model-parallel-size 1
)

python -m torch.distributed.run ${DISTRIBUTED_ARGS[@]} ${PRETRAIN_SCRIPT_PATH} \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 201088 \
    --save "$CHECKPOINT_PATH"
