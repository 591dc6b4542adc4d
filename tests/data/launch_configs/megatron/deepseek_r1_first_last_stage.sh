#!/bin/bash
# DeepSeek-R1 (V3 architecture) on 32 nodes: uneven first and last pipeline stages, the old
# --recompute-activations switch, MoE layers as Megatron's pattern list.
NNODES=32
GPUS_PER_NODE=8

MODEL_ARGS=" \
    --micro-batch-size 1 \
    --global-batch-size 1024 \
    --bf16 \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --num-layers 61 \
    --hidden-size 7168 \
    --ffn-hidden-size 18432 \
    --num-attention-heads 128 \
    --kv-channels 128 \
    --multi-latent-attention \
    --kv-lora-rank 512 \
    --v-head-dim 128 \
    --q-lora-rank 1536 \
    --qk-head-dim 128 \
    --qk-layernorm \
    --qk-pos-emb-head-dim 64 \
    --num-experts 256 \
    --moe-layer-freq [0]*3+[1]*58 \
    --moe-ffn-hidden-size 2048 \
    --moe-router-topk 8 \
    --moe-shared-expert-intermediate-size 2048 \
    --seq-length 4096 \
    --max-position-embeddings 163840 \
    --tokenizer-type HuggingFaceTokenizer \
    --tokenizer-model deepseek-ai/DeepSeek-R1 \
    --padded-vocab-size 129280 \
    --use-mcore-models \
    --recompute-activations \
    --moe-layer-recompute \
    --sequence-parallel \
"

PARALLEL_ARGS=" \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 4 \
    --decoder-first-pipeline-num-layers 13 \
    --decoder-last-pipeline-num-layers 16 \
    --expert-model-parallel-size 64 \
    --expert-tensor-parallel-size 1 \
    --use-distributed-optimizer \
"

torchrun --nproc_per_node ${GPUS_PER_NODE} --nnodes ${NNODES} pretrain_gpt.py ${MODEL_ARGS} ${PARALLEL_ARGS}
