#!/bin/bash
# DeepSeek-V2-Lite (27 layers) on pp 4: the first stage's layer count from MP_PP0_LAYERS (the README's
# `export MP_PP0_LAYERS=6`), checked with $(( )) then given as --decoder-first-pipeline-num-layers; MLA,
# one dense layer then MoE layers (--moe-layer-freq pattern), shared experts as one MLP.
ENV=$1
if [ $ENV = dsw ]; then
    GPUS_PER_NODE=8
    NNODES=1
    NODE_RANK=0
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
TP=$6
PP=$7
ETP=$8
EP=$9
AC=${10}

if [ $MODEL_SIZE = A2.4B ]; then
    NUM_LAYERS=27
    HIDDEN_SIZE=2048
    NUM_ATTN_HEADS=16
    INTERMEDIATE_SIZE=10944
    MOE_INTERMEDIATE_SIZE=1408
    NUM_EXPERTS=64
    ROUTER_TOPK=6
    SHARED_EXPERTS=2
    KV_LORA_RANK=512
    QK_NOPE_HEAD_DIM=128
    QK_ROPE_HEAD_DIM=64
    V_HEAD_DIM=128
fi

if [ -z ${MP_PP0_LAYERS} ]; then
    uneven_split_option=""
elif [ ${PP} -gt 1 ]; then
    _check=$(( ( $NUM_LAYERS - ${MP_PP0_LAYERS} ) % ( ${PP} - 1 ) ))
    if [ $_check != 0 ]; then
        echo "With uneven pipelineing the left over layers must be divisible by left over stages."
        exit -1
    fi
    uneven_split_option=" \
        --decoder-first-pipeline-num-layers ${MP_PP0_LAYERS}"
else
    echo "uneven pipeline split must be used when PP > 1"
    exit -1
fi

if [ $AC = sel ]; then
    activation_checkpoint_options="--recompute-activations"
fi

moe_options=" \
    --moe-ffn-hidden-size ${MOE_INTERMEDIATE_SIZE} \
    --moe-router-topk ${ROUTER_TOPK} \
    --num-experts ${NUM_EXPERTS} \
    --moe-layer-freq '([0]*1+[1]*26)' \
    --moe-shared-expert-intermediate-size $((${MOE_INTERMEDIATE_SIZE} * ${SHARED_EXPERTS})) \
    --expert-model-parallel-size ${EP} \
    --expert-tensor-parallel-size ${ETP} \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall"

mla_options=" \
    --multi-latent-attention \
    --kv-lora-rank ${KV_LORA_RANK} \
    --qk-head-dim ${QK_NOPE_HEAD_DIM} \
    --qk-pos-emb-head-dim ${QK_ROPE_HEAD_DIM} \
    --v-head-dim ${V_HEAD_DIM} \
    --qk-layernorm"

run_cmd="torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK pretrain_deepseek.py \
    --micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE} \
    --num-layers ${NUM_LAYERS} --hidden-size ${HIDDEN_SIZE} --num-attention-heads ${NUM_ATTN_HEADS} \
    --ffn-hidden-size ${INTERMEDIATE_SIZE} --seq-length ${SEQ_LEN} --max-position-embeddings 163840 \
    --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} \
    --padded-vocab-size 102400 --patch-tokenizer-type DeepSeekV2Tokenizer \
    --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear \
    --untie-embeddings-and-output-weights --bf16 --use-distributed-optimizer \
    ${moe_options} ${mla_options} ${activation_checkpoint_options} ${uneven_split_option}"
eval ${run_cmd}
