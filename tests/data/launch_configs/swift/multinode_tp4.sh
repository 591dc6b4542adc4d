PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True' \
CUDA_VISIBLE_DEVICES=0,1,2,3 \
NNODES=2 \
NODE_RANK=0 \
MASTER_ADDR=10.0.0.1 \
MASTER_PORT=29500 \
NPROC_PER_NODE=4 \
megatron sft \
    --model Qwen/Qwen2.5-14B \
    --dataset 'my-org/sft-mix' \
    --tensor_model_parallel_size 4 \
    --micro_batch_size 2 \
    --global_batch_size 16 \
    --packing true \
    --recompute_granularity selective \
    --num_train_epochs 3 \
    --max_length 4096 \
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
