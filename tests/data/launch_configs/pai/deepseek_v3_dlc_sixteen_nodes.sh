#!/bin/bash
# DeepSeek-V3 (61 layers) on 16 DLC nodes of 8: tp 8, pp 8, ep 16, the first stage 5 layers
# (MP_PP0_LAYERS, the README's `export MP_PP0_LAYERS=5`), three dense layers then MoE, MLA with a q rank,
# one MTP layer; optimizer offload asked for with a fraction.
ENV=$1
if [ $ENV = dsw ]; then
    GPUS_PER_NODE=8; NNODES=1; NODE_RANK=0
elif [ $ENV = dlc ]; then
    NNODES=${WORLD_SIZE}
    NODE_RANK=${RANK}
    GPUS_PER_NODE=${KUBERNETES_CONTAINER_RESOURCE_GPU}
fi
MODEL_SIZE=$2
BATCH_SIZE=$3
GLOBAL_BATCH_SIZE=$4
SEQ_LEN=$5
TP=$6
PP=$7
ETP=$8
EP=$9
OPTIMIZER_OFFLOAD=${10}

if [ $MODEL_SIZE = A37B ]; then
    NUM_LAYERS=61
    HIDDEN_SIZE=7168
    NUM_ATTN_HEADS=128
    INTERMEDIATE_SIZE=18432
    MOE_INTERMEDIATE_SIZE=2048
    Q_LORA_RANK=1536
    KV_LORA_RANK=512
    NUM_EXPERTS=256
    ROUTER_TOPK=8
    NUM_SHARED_EXPERTS=1
    moe_layer_freq="'([0]*3+[1]*58)'"
    mtp_options="--mtp-num-layers 1"
fi

if [ -z ${MP_PP0_LAYERS} ]; then
    uneven_split_option=""
elif [ ${PP} -gt 1 ]; then
    uneven_split_option="--decoder-first-pipeline-num-layers ${MP_PP0_LAYERS}"
fi

if [ $OPTIMIZER_OFFLOAD != false ]; then
    offload_option="--optimizer-cpu-offload --use-precision-aware-optimizer --optimizer-offload-fraction ${OPTIMIZER_OFFLOAD}"
fi

run_cmd="torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK pretrain_deepseek.py \
 --micro-batch-size ${BATCH_SIZE} --global-batch-size ${GLOBAL_BATCH_SIZE} --num-layers ${NUM_LAYERS} \
 --hidden-size ${HIDDEN_SIZE} --num-attention-heads ${NUM_ATTN_HEADS} --ffn-hidden-size ${INTERMEDIATE_SIZE} \
 --seq-length ${SEQ_LEN} --tensor-model-parallel-size ${TP} --pipeline-model-parallel-size ${PP} \
 --expert-tensor-parallel-size ${ETP} --expert-model-parallel-size ${EP} --num-experts ${NUM_EXPERTS} \
 --moe-router-topk ${ROUTER_TOPK} --moe-ffn-hidden-size ${MOE_INTERMEDIATE_SIZE} \
 --moe-shared-expert-intermediate-size $((${MOE_INTERMEDIATE_SIZE} * ${NUM_SHARED_EXPERTS})) \
 --moe-layer-freq ${moe_layer_freq} --multi-latent-attention --q-lora-rank ${Q_LORA_RANK} \
 --kv-lora-rank ${KV_LORA_RANK} --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128 \
 --padded-vocab-size 129280 --swiglu --normalization RMSNorm --position-embedding-type rope \
 --disable-bias-linear --untie-embeddings-and-output-weights --bf16 --use-distributed-optimizer \
 --sequence-parallel --recompute-activations ${uneven_split_option} ${offload_option} ${mtp_options}"
eval ${run_cmd}
