#!/bin/bash
# Qwen3-30B-A3B pre-training on PAI-DLC: positional arguments up to ${18}, the node count from DLC's
# environment, options kept in strings set per branch, and the command line built in a string and run
# with eval (the construct of Pai-Megatron-Patch's run_mcore_*.sh).
set -e
ENV=$1
export CUDA_DEVICE_MAX_CONNECTIONS=1
if [ $ENV = dsw ]; then
    MASTER_ADDR=localhost
    NNODES=1
    NODE_RANK=0
    GPUS_PER_NODE=8
elif [ $ENV = dlc ]; then
    NNODES=${WORLD_SIZE}
    NODE_RANK=${RANK}
    GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU}
fi
DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR"

MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
PR=$6
TP=$7
PP=$8
CP=$9
ETP=${10}
EP=${11}
SP=${12}
DO=${13}
AC=${14}

if [ $MODEL_SIZE = 8B ]; then
    NUM_LAYERS=36
    HIDDEN_SIZE=4096
    NUM_ATTENTION_HEADS=32
    INTERMEDIATE_SIZE=12288
    NUM_KEY_VALUE_HEADS=8
    moe_options=""
elif [ $MODEL_SIZE = A3B ]; then
    NUM_LAYERS=48
    HIDDEN_SIZE=2048
    NUM_ATTENTION_HEADS=32
    INTERMEDIATE_SIZE=6144
    NUM_KEY_VALUE_HEADS=4
    moe_options=" \
        --moe-grouped-gemm \
        --moe-token-dispatcher-type alltoall \
        --moe-router-topk 8 \
        --num-experts 128 \
        --expert-tensor-parallel-size ${ETP} \
        --expert-model-parallel-size ${EP} \
        --moe-ffn-hidden-size 768 \
        --moe-layer-freq '([1]*48)'"
fi

TP_COMM_OVERLAP=$(( ($TP > 1) ? 1 : 0 ))
comm_overlap_option="--overlap-grad-reduce --overlap-param-gather"
if [ $TP_COMM_OVERLAP -eq 1 ]; then
    comm_overlap_option="--tp-comm-overlap --overlap-grad-reduce --overlap-param-gather"
fi

if [ $AC = full ]; then
    activation_checkpoint_options="--recompute-method uniform --recompute-num-layers 1 --recompute-granularity full"
elif [ $AC = sel ]; then
    activation_checkpoint_options="--recompute-activations"
fi

if [ $PR = bf16 ]; then
    pr_options="--bf16"
fi
if [ $DO = true ]; then
    do_option="--use-distributed-optimizer"
fi
if [ $SP = true ] && [ $TP -gt 1 ]; then
    sp_option="--sequence-parallel"
fi

megatron_options="  \
        --micro-batch-size ${BATCH_SIZE} \
        --global-batch-size ${GLOBAL_BATCH_SIZE} \
        --num-layers ${NUM_LAYERS} \
        --hidden-size ${HIDDEN_SIZE} \
        --num-attention-heads ${NUM_ATTENTION_HEADS} \
        --ffn-hidden-size ${INTERMEDIATE_SIZE} \
        --seq-length ${SEQ_LEN} \
        --max-position-embeddings 40960 \
        --tensor-model-parallel-size ${TP} \
        --pipeline-model-parallel-size ${PP} \
        --context-parallel-size ${CP} \
        --padded-vocab-size 151936 \
        --patch-tokenizer-type Qwen3Tokenizer \
        --swiglu \
        --normalization RMSNorm \
        --position-embedding-type rope \
        --disable-bias-linear \
        --untie-embeddings-and-output-weights \
        --qk-layernorm \
        --kv-channels 128 \
        --group-query-attention \
        --num-query-groups ${NUM_KEY_VALUE_HEADS}"

run_cmd="torchrun $DISTRIBUTED_ARGS pretrain_qwen.py
 ${megatron_options} ${pr_options} ${activation_checkpoint_options} ${do_option} ${sp_option} ${moe_options} ${comm_overlap_option}"

echo ${run_cmd}
eval ${run_cmd}
