#!/bin/bash
# Llama-3-8B with Megatron-FSDP; the sharding strategy chosen by an if/elif/else on $SHARDING
# (default optim_grads_params; --env SHARDING=optim_grads gives ZeRO-2), an optional profiler
# prefix from an empty array, an unset $VENV_PREFIX before the launcher.
# Exercises: ${VAR:-x}, if/elif/else, [ = ], "${EMPTY[@]}", $VAR unset at command start.

export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-1}

CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b_fsdp"}
GPUS_PER_NODE=8
NUM_NODES=1
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-6000}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))

PRETRAIN_SCRIPT_PATH="pretrain_gpt.py"
SHARDING=${SHARDING:-optim_grads_params}

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
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
    --global-batch-size 128
    --train-samples 1953125000
    --bf16
)

if [ "$SHARDING" = "optim_grads_params" ]; then
    FSDP_ARGS=(
        --use-megatron-fsdp
        --data-parallel-sharding-strategy optim_grads_params
        --no-gradient-accumulation-fusion
    )
elif [ "$SHARDING" = "optim_grads" ]; then
    FSDP_ARGS=(
        --use-megatron-fsdp
        --data-parallel-sharding-strategy optim_grads
    )
else
    FSDP_ARGS=(--use-distributed-optimizer)
fi
TRAINING_ARGS+=("${FSDP_ARGS[@]}")

if [ "${NSYS_PROFILE}" = 1 ]; then
    PROFILE_CMD=(
        nsys profile
        -f true -x true -o "$NSYS_PROFILE_PATH"
    )
else
    PROFILE_CMD=()
fi

$VENV_PREFIX "${PROFILE_CMD[@]}" python -m torch.distributed.run ${DISTRIBUTED_ARGS[@]} \
    "$PRETRAIN_SCRIPT_PATH" \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    --tensor-model-parallel-size 1 \
    --mock-data --tokenizer-type NullTokenizer --vocab-size 128256 \
    --save "$CHECKPOINT_PATH"
