"""Models from libraries users already have, built offline from configs, for ``partita plan``.

Each function returns ``(model, example_inputs)`` (plus a TP plan where one exists);
``partita plan --model examples.traced_models:sdxl_unet`` calls it under
``torch.device("meta")`` and traces it (issue 19), so even the 2.6 B-parameter SD-XL UNet
costs no memory::

    partita plan --model examples.traced_models:sdxl_unet --hardware ascend-910b3 --devices 64 --global-batch 1024
    partita plan --model examples.traced_models:dit_xl --hardware h100-sxm --devices 64 --global-batch 1024
    partita plan --model examples.traced_models:vit_huge --hardware ascend-910b3 --devices 64 --global-batch 4096

The first run imports torch and the model's library (most of its time) and traces; the trace
is cached on disk (``partita.tracing.cache``), so the same command again plans without
importing torch (``--no-trace-cache`` traces anew).

The ``tiny_*`` functions build the same architectures small enough to train on a CPU
(tests/test_trace_runtime.py trains them under ``partita.parallelize``). Config values of
the full-size models: SD-XL base ``unet/config.json`` (stabilityai/stable-diffusion-xl-base-1.0),
DiT-XL/2 (Peebles & Xie 2023, Table 1: 28 layers, width 1152, 16 heads, patch 2 on a
32 x 32 latent), ViT-H/14 (Dosovitskiy et al. 2021, Table 1: 32 layers, width 1280, MLP 5120, 16 heads).
"""
from __future__ import annotations

import torch

#: the Megatron layout for transformers 5 ViT layers (colwise q/k/v and fc1, rowwise o_proj and fc2),
#: as module patterns relative to one ViTLayer
VIT_TP_PLAN = {"attention.[qkv]_proj": "colwise", "attention.o_proj": "rowwise",
               "mlp.fc1": "colwise", "mlp.fc2": "rowwise"}
#: the same plus the classification head split column-wise, its logits gathered to every rank
VIT_TP_PLAN_HEAD = {**VIT_TP_PLAN, "classifier": "colwise_rep"}


def _unet(batch: int, sample: int, channels: tuple[int, ...], layers: tuple[int, ...], heads: tuple[int, ...],
          cross: int, groups: int = 32, sdxl: bool = True):
    from diffusers import UNet2DConditionModel
    kinds = len(channels)
    kwargs = dict(sample_size=sample, in_channels=4, out_channels=4, block_out_channels=channels,
                  down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (kinds - 1),
                  up_block_types=("CrossAttnUpBlock2D",) * (kinds - 1) + ("UpBlock2D",), layers_per_block=2,
                  transformer_layers_per_block=layers, attention_head_dim=heads, cross_attention_dim=cross,
                  norm_num_groups=groups, use_linear_projection=True)
    text = 1280 if cross == 2048 else cross  # SD-XL's pooled text embedding (OpenCLIP bigG) is 1280 wide
    if sdxl:  # the added embedding reads 6 time ids, each embedded addition_time_embed_dim wide, beside the text
        kwargs.update(addition_embed_type="text_time", addition_time_embed_dim=256,
                      projection_class_embeddings_input_dim=256 * 6 + text)
    model = UNet2DConditionModel(**kwargs)
    inputs = {"sample": torch.zeros(batch, 4, sample, sample), "timestep": torch.ones(batch),
              "encoder_hidden_states": torch.zeros(batch, 77, cross)}
    if sdxl:
        inputs["added_cond_kwargs"] = {"text_embeds": torch.zeros(batch, text), "time_ids": torch.zeros(batch, 6)}
    return model, inputs


def sdxl_unet(batch: int = 1):
    """The SD-XL base UNet (2.57 B parameters) at 1024 x 1024 (a 128 x 128 latent)."""
    return _unet(batch, 128, (320, 640, 1280), (1, 2, 10), (5, 10, 20), 2048)


def tiny_unet(batch: int = 2):
    """An SD-XL-shaped UNet small enough for a CPU test (two resolutions, 8 x 8 latent)."""
    from diffusers import UNet2DConditionModel
    model = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32),
                                 down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                 up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), layers_per_block=1,
                                 transformer_layers_per_block=(1, 2), attention_head_dim=(4, 8),
                                 cross_attention_dim=16, norm_num_groups=8, use_linear_projection=True)
    inputs = {"sample": torch.randn(batch, 4, 8, 8), "timestep": torch.ones(batch),
              "encoder_hidden_states": torch.randn(batch, 6, 16)}
    return model, inputs


def _dit(batch: int, layers: int, heads: int, head_dim: int, sample: int):
    from diffusers import DiTTransformer2DModel
    model = DiTTransformer2DModel(num_attention_heads=heads, attention_head_dim=head_dim, in_channels=4,
                                  num_layers=layers, sample_size=sample, patch_size=2, num_embeds_ada_norm=1000)
    inputs = {"hidden_states": torch.zeros(batch, 4, sample, sample), "timestep": torch.ones(batch, dtype=torch.long),
              "class_labels": torch.zeros(batch, dtype=torch.long)}
    return model, inputs


def dit_xl(batch: int = 1):
    """DiT-XL/2 at 256 x 256 (a 32 x 32 latent, 256 patches; 675 M parameters)."""
    return _dit(batch, 28, 16, 72, 32)


def tiny_dit(batch: int = 2):
    model, inputs = _dit(batch, 2, 2, 8, 8)
    inputs["hidden_states"] = torch.randn(batch, 4, 8, 8)
    inputs["timestep"] = torch.tensor([3, 500][:batch] * (batch // 2 or 1))[:batch]
    inputs["class_labels"] = torch.arange(batch) % 1000
    return model, inputs


def _vit(batch: int, hidden: int, layers: int, heads: int, ffn: int, image: int, patch: int, labels: int):
    from transformers import ViTConfig, ViTForImageClassification
    config = ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                       intermediate_size=ffn, image_size=image, patch_size=patch, num_labels=labels)
    config._attn_implementation = "sdpa"
    model = ViTForImageClassification(config)
    return model, (torch.zeros(batch, 3, image, image),), VIT_TP_PLAN


def vit_huge(batch: int = 1):
    """ViT-H/14 at 224 x 224, 1000 classes (632 M parameters)."""
    return _vit(batch, 1280, 32, 16, 5120, 224, 14, 1000)


def tiny_vit(batch: int = 2):
    model, _, plan = _vit(batch, 32, 2, 4, 64, 16, 4, 10)
    return model, (torch.randn(batch, 3, 16, 16),), plan


def tiny_vit_tp_head(batch: int = 2):
    """:func:`tiny_vit` with a TP plan that also splits the classifier (``colwise_rep``)."""
    model, inputs, _ = tiny_vit(batch)
    return model, inputs, VIT_TP_PLAN_HEAD
