#!/bin/bash
# Moonlight-16B-A3B (MLA + MoE, 8 experts per device) with OPTIMIZER_OFFLOAD=0.5: the script forces the
# distributed optimizer on (DO=true) when offload is asked for, then adds Megatron's optimizer CPU offload.
ENV=$1
if [ $ENV = dsw ]; then
    GPUS_PER_NODE=8
    NNODES=1
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
TP=$6
PP=$7
ETP=$8
EP=$9
DO=${10}
OPTIMIZER_OFFLOAD=${11}

if [ $MODEL_SIZE = A3B ]; then
    NUM_LAYERS=27
    HIDDEN_SIZE=2048
    NUM_ATTN_HEADS=16
    INTERMEDIATE_SIZE=11264
    MOE_INTERMEDIATE_SIZE=1408
    NUM_EXPERTS=64
    ROUTER_TOPK=6
fi

if [ $OPTIMIZER_OFFLOAD != false ] && [ $DO = false ]; then
    echo "Offload optimizer is valid only if \$DO=true"
    DO=true
fi

if [ $DO = true ]; then
    do_option=" \
        --use-distributed-optimizer"
elif [ $DO = false ]; then
    do_option=" \
        "
fi

if [ $OPTIMIZER_OFFLOAD != false ]; then
    offload_option=" \
        --optimizer-cpu-offload \
        --use-precision-aware-optimizer \
        --optimizer-offload-fraction ${OPTIMIZER_OFFLOAD}"
fi

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_deepseek.py \
    --micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers ${NUM_LAYERS} --hidden-size ${HIDDEN_SIZE} --num-attention-heads ${NUM_ATTN_HEADS} \
    --ffn-hidden-size ${INTERMEDIATE_SIZE} --seq-length ${SEQ_LEN} \
    --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} \
    --expert-tensor-parallel-size ${ETP} --expert-model-parallel-size ${EP} \
    --num-experts ${NUM_EXPERTS} --moe-router-topk ${ROUTER_TOPK} --moe-ffn-hidden-size ${MOE_INTERMEDIATE_SIZE} \
    --moe-shared-expert-intermediate-size 2816 --moe-layer-freq '([0]*1+[1]*26)' \
    --multi-latent-attention --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 \
    --padded-vocab-size 163840 --swiglu --normalization RMSNorm --position-embedding-type rope \
    --disable-bias-linear --untie-embeddings-and-output-weights --bf16 \
    ${do_option} ${offload_option}
