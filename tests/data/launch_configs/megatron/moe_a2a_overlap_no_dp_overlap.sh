#!/bin/bash
# A 12-layer, 8-expert GPT MoE on one node of 8 GPUs (tp 2, ep 4): the expert-parallel all-to-all
# overlapped with another micro-batch (--overlap-moe-expert-parallel-comm), the data-parallel
# gradient reduction and the tensor-parallel communication left unoverlapped (no
# --overlap-grad-reduce, no --tp-comm-overlap). Trimmed from NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553:
# tests/functional_tests/test_cases/moe/gpt3_mcore_te_tp2_pp1_te_a2a_ovlp_8experts_etp1_ep4_1node/model_config.yaml
# (its MODEL_ARGS as a torchrun command; logging, data and checkpoint flags dropped).
GPUS_PER_NODE=8

torchrun --nproc_per_node $GPUS_PER_NODE --nnodes 1 pretrain_gpt.py \
    --num-layers 12 \
    --hidden-size 512 \
    --num-attention-heads 8 \
    --micro-batch-size 4 \
    --global-batch-size 32 \
    --seq-length 1024 \
    --max-position-embeddings 1024 \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --expert-model-parallel-size 4 \
    --expert-tensor-parallel-size 1 \
    --disable-bias-linear \
    --sequence-parallel \
    --num-experts 8 \
    --moe-router-topk 2 \
    --moe-grouped-gemm \
    --moe-token-dispatcher-type alltoall \
    --overlap-moe-expert-parallel-comm \
    --transformer-impl transformer_engine \
    --vocab-size 50304 \
    --bf16 \
    --attention-backend unfused
