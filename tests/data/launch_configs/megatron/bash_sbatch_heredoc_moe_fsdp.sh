#!/bin/bash
# A MoE model with Megatron-FSDP submitted to SLURM: the sizes from the environment with defaults,
# the argument array re-declared with its own contents in ifs, the job written as an sbatch
# here-document whose srun runs pretrain_gpt.py (the world size is the #SBATCH allocation; given
# here as --devices 64, since bash run with shims does not see the #SBATCH lines).
# Exercises: ${VAR:-x}, A=("${A[@]}" ...) in if [ = ], unset, sbatch <<EOF ... EOF, #SBATCH, srun.

export NCCL_IB_SL=1
export NCCL_IB_TIMEOUT=19
export TORCH_NCCL_AVOID_RECORD_STREAMS=1

MEGATRON_PATH=${MEGATRON_PATH:-"your_own_megatron_path"}
OUTPUT_PATH=${OUTPUT_PATH:-"your_own_output_path"}
DATA_PATH=${DATA_PATH:-"your_own_data_path"}
USE_MEGATRON_FSDP=${USE_MEGATRON_FSDP:-1}
SHARDING_STRATEGY=${SHARDING_STRATEGY:-"optim_grads_params"}
PROFILE=${PROFILE:-0}

TP=${TP:-1}
EP=${EP:-8}
MBS=${MBS:-4}
GBS=${GBS:-2048}

PRETRAIN_ARGS=(
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 4096
    --max-position-embeddings 4096
    --position-embedding-type rope
    --swiglu
    --normalization RMSNorm
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --num-experts 8
    --moe-router-topk 2
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --recompute-granularity selective
    --recompute-modules mlp moe layernorm
    --tensor-model-parallel-size $TP
    --expert-model-parallel-size $EP
    --micro-batch-size $MBS
    --global-batch-size $GBS
    --bf16
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 32000
)

if [ "${USE_MEGATRON_FSDP}" = 1 ]; then
    unset CUDA_DEVICE_MAX_CONNECTIONS
    PRETRAIN_ARGS=(
        "${PRETRAIN_ARGS[@]}"
        --use-megatron-fsdp
        --data-parallel-sharding-strategy ${SHARDING_STRATEGY}
        --no-gradient-accumulation-fusion
    )
else
    PRETRAIN_ARGS=(
        "${PRETRAIN_ARGS[@]}"
        --use-distributed-optimizer
    )
fi

if [ "${PROFILE}" = 1 ]; then
    PRETRAIN_ARGS=(
        "${PRETRAIN_ARGS[@]}"
        --profile
        --profile-step-start 10
        --profile-step-end 12
    )
fi

SLURM_LOGS="${OUTPUT_PATH}/slurm_logs"
mkdir -p ${SLURM_LOGS} || {
    echo "Error: Failed to create SLURM logs directory ${SLURM_LOGS}"
    exit 1
}

sbatch <<EOF
#!/bin/bash

#SBATCH --job-name=moe_fsdp
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=8
#SBATCH --gres=gpu:8
#SBATCH --exclusive

srun \
    --mpi=pmix -l \
    --container-workdir=${MEGATRON_PATH} \
    python ${MEGATRON_PATH}/pretrain_gpt.py ${PRETRAIN_ARGS[@]} --data-path ${DATA_PATH} \
    2>&1 | tee ${SLURM_LOGS}/\${SLURM_JOB_ID}.log
EOF
