#!/bin/bash
# One script for two model sizes, chosen by a case on MODEL_SCALE (default 8B; --env
# MODEL_SCALE=70B); the flags in one string with backslash-newlines inside its quotes.
# Exercises: case "${VAR}" in "a") ... ;; *) exit ;; esac, ${VAR:-x}, "...\<newline>..." strings,
# an unquoted $options split into words, $1/$2 not read.

MODEL_SCALE=${MODEL_SCALE:-"8B"} # or "70B"

case "${MODEL_SCALE}" in
    "8B")
        TENSOR_MODEL_PARALLEL_SIZE=1
        PIPELINE_MODEL_PARALLEL_SIZE=1
        NUM_LAYERS=32
        HIDDEN_SIZE=4096
        FFN_HIDDEN_SIZE=14336
        NUM_ATTENTION_HEADS=32
        GLOBAL_BATCH_SIZE=128
        ;;
    "70B")
        TENSOR_MODEL_PARALLEL_SIZE=8
        PIPELINE_MODEL_PARALLEL_SIZE=4
        NUM_LAYERS=80
        HIDDEN_SIZE=8192
        FFN_HIDDEN_SIZE=28672
        NUM_ATTENTION_HEADS=64
        GLOBAL_BATCH_SIZE=512
        ;;
    *)
        echo "Invalid version specified"
        exit 1
        ;;
esac

DATA_PATH=$1
TOKENIZER_PATH=$2

export NCCL_IB_SL=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_IB_TIMEOUT=19
export NCCL_IB_QPS_PER_CONNECTION=4

CHECKPOINT_DIR="./checkpoints"
DATACACHE_DIR="./data-cache"
TENSORBOARD_DIR="./tensorboard"

mkdir -p ${CHECKPOINT_DIR}
mkdir -p ${DATACACHE_DIR}
mkdir -p ${TENSORBOARD_DIR}

SEQ_LEN=4096
TRAIN_SAMPLES=73242188  # 300B tokens / 4096
LR_WARMUP_SAMPLES=50000
LR_DECAY_SAMPLES=73192188 # TRAIN_SAMPLES - LR_WARMUP_SAMPLES

options=" \
       --tensor-model-parallel-size ${TENSOR_MODEL_PARALLEL_SIZE} \
       --pipeline-model-parallel-size ${PIPELINE_MODEL_PARALLEL_SIZE} \
       --sequence-parallel \
       --use-distributed-optimizer \
       --overlap-param-gather \
       --overlap-grad-reduce \
       --untie-embeddings-and-output-weights \
       --init-method-std 0.02 \
       --position-embedding-type rope \
       --num-layers ${NUM_LAYERS} \
       --hidden-size ${HIDDEN_SIZE} \
       --ffn-hidden-size ${FFN_HIDDEN_SIZE} \
       --num-attention-heads ${NUM_ATTENTION_HEADS} \
       --group-query-attention \
       --num-query-groups 8 \
       --swiglu \
       --normalization RMSNorm \
       --disable-bias-linear \
       --seq-length ${SEQ_LEN} \
       --max-position-embeddings ${SEQ_LEN} \
       --train-samples ${TRAIN_SAMPLES} \
       --lr-warmup-samples ${LR_WARMUP_SAMPLES} \
       --lr-decay-samples ${LR_DECAY_SAMPLES} \
       --save ${CHECKPOINT_DIR} \
       --load ${CHECKPOINT_DIR} \
       --data-path ${DATA_PATH} \
       --data-cache-path ${DATACACHE_DIR} \
       --split 99,1,0 \
       --tokenizer-type GPTSentencePieceTokenizer \
       --tokenizer-model ${TOKENIZER_PATH} \
       --micro-batch-size 1 \
       --global-batch-size ${GLOBAL_BATCH_SIZE} \
       --lr 2.5e-4 \
       --min-lr 2.5e-5 \
       --lr-decay-style cosine \
       --weight-decay 0.1 \
       --clip-grad 1.0 \
       --attention-dropout 0.0 \
       --hidden-dropout 0.0 \
       --bf16 \
       --tensorboard-dir ${TENSORBOARD_DIR}"

torchrun --nproc_per_node 8 --nnodes ${NNODES:-4} pretrain_gpt.py ${options}
