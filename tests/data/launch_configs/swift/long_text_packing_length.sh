# 4 x A100, 32K packed
PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' \
NPROC_PER_NODE=4 \
CUDA_VISIBLE_DEVICES=0,1,2,3 \
megatron sft \
    --model Qwen/Qwen2.5-7B \
    --dataset 'my-org/long-docs' \
    --tensor_model_parallel_size 4 \
    --context_parallel_size 1 \
    --micro_batch_size 1 \
    --global_batch_size 8 \
    --packing true \
    --packing_length 32768 \
    --recompute_granularity full \
    --recompute_method uniform \
    --recompute_num_layers 1 \
    --train_iters 1000 \
    --max_length 16384 \
    --sequence_parallel true \
    --save_safetensors true \
    --load_from_cache_file true \
    --split_dataset_ratio 0.02 \
    --finetune true \
    --cross_entropy_loss_fusion true \
    --lr 2e-5 \
    --lr_warmup_fraction 0.05 \
    --min_lr 2e-6 \
    --eval_steps 250 \
    --save_steps 250 \
    --dataloader_num_workers 4 \
    --dataset_num_proc 4 \
    --no_save_optim true \
    --no_save_rng true \
    --attention_backend flash
