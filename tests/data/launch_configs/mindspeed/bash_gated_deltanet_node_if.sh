#!/bin/bash
# The pipeline split and the HF->Megatron conversion flag chosen by if statements: pp 2 when the
# job spans nodes (--env NNODES=2), the conversion flag when a checkpoint directory is given.
# Exercises: ${VAR:-x}, if [ -gt ]; then ...; else ...; fi, if [ != ], an empty string variable.
export CUDA_DEVICE_MAX_CONNECTIONS=1
export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True

NPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

CKPT_LOAD_DIR="None"
CKPT_SAVE_DIR="your model save ckpt path"
DATA_PATH="your data path"
TOKENIZER_PATH="your tokenizer path"

TP=1
if [ "$NNODES" -gt 1 ]; then
    PP=2
else
    PP=1
fi
SEQ_LEN=4096
MBS=2
GBS=128

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
    --num-layers 24 \
    --hidden-size 1024 \
    --ffn-hidden-size 2816 \
    --num-attention-heads 16 \
    --seq-length ${SEQ_LEN} \
    --max-position-embeddings ${SEQ_LEN} \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 32000 \
    --tokenizer-type PretrainedFromHF \
    --tokenizer-name-or-path ${TOKENIZER_PATH} \
    --position-embedding-type rope \
    --use-fused-rmsnorm \
    --normalization RMSNorm \
    --swiglu \
    --use-fused-swiglu \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --lr 3e-4 \
    --train-iters 2000 \
    --bf16
"

DATA_ARGS="
    --data-path $DATA_PATH \
    --split 100,0,0
"

# if CKPT_LOAD_DIR points at HuggingFace weights, convert them while loading
HF2MG_ARGS=""
if [ "${CKPT_LOAD_DIR}" != "None" ]; then
    HF2MG_ARGS="--enable-hf2mg-convert"
fi

CKPT_ARGS="
    --load ${CKPT_LOAD_DIR} \
    --save ${CKPT_SAVE_DIR} \
    ${HF2MG_ARGS}
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $GPT_ARGS \
    $DATA_ARGS \
    $CKPT_ARGS \
    --distributed-backend nccl \
    | tee logs/train_gated_deltanet_340m.log
