#!/bin/bash
# A MindSpeed-LLM LoRA fine-tune of a Qwen3-8B-shaped model: --lora-r / --lora-alpha / the four
# Megatron-Core linears, --finetune --stage sft --is-instruction-dataset, samples not padded.
# Follows the public script named in the .expected.json.
export CUDA_DEVICE_MAX_CONNECTIONS=1
NPUS_PER_NODE=8
NNODES=1
NODE_RANK=0
MASTER_ADDR=localhost
TP=1
PP=2
SEQ_LEN=4096
DISTRIBUTED_ARGS="--nproc_per_node $NPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port 6000"
TUNE_ARGS="
    --finetune \
    --stage sft \
    --is-instruction-dataset \
    --prompt-type qwen3 \
    --no-pad-to-seq-lengths \
    --lora-r 16 \
    --lora-alpha 32 \
    --lora-fusion \
    --lora-target-modules linear_qkv linear_proj linear_fc1 linear_fc2
"
GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --use-distributed-optimizer \
    --num-layers 36 \
    --hidden-size 4096 \
    --ffn-hidden-size 12288 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --kv-channels 128 \
    --qk-layernorm \
    --seq-length ${SEQ_LEN} \
    --max-position-embeddings ${SEQ_LEN} \
    --micro-batch-size 4 \
    --global-batch-size 64 \
    --make-vocab-size-divisible-by 1 \
    --padded-vocab-size 151936 \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --position-embedding-type rope \
    --normalization RMSNorm \
    --swiglu \
    --use-flash-attn \
    --bf16
"
torchrun $DISTRIBUTED_ARGS posttrain_gpt.py $GPT_ARGS $TUNE_ARGS --data-path "your data path"
