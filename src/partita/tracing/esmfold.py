"""ESMFold configurations built offline (transformers' ``EsmForProteinFolding``, random weights).

``esmfold-tiny`` is the CPU validation model of ``bench/esmfold_sweep.py`` and the tests: a
2-layer ESM-2 stem (hidden 32) and a 2-block folding trunk (sequence state 64, pair state 32,
head width 16) with a 2-block structure module, one pass (no recycling). ``esmfold-v1`` is
``facebook/esmfold_v1``'s shape (its ``config.json``: ESM-2 3B stem - 36 layers, hidden 2560,
40 heads - and the default 48-block trunk, sequence 1024 / pair 128; ``fp16_esm``), built
without weights on the meta device. Inputs are AlphaFold residue indices 0-19 (``aatype``), one
sequence of length ``L``; the pair representation is ``L x L x pairwise_state_dim``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import unknown_name

_TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             trunk=dict(num_blocks=2, sequence_state_dim=64, pairwise_state_dim=32, sequence_head_width=16,
                        pairwise_head_width=16, max_recycles=1, chunk_size=None,
                        structure_module=dict(sequence_dim=32, pairwise_dim=16, ipa_dim=8, resnet_dim=16,
                                              num_heads_ipa=2, num_qk_points=2, num_v_points=2, num_blocks=2)),
             fp16_esm=False, lddt_head_hid_dim=16)
_V1 = dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=40, intermediate_size=10240,
           trunk=dict(max_recycles=4, chunk_size=None), fp16_esm=True, lddt_head_hid_dim=128)
CONFIGS: dict[str, dict[str, Any]] = {"esmfold-tiny": _TINY, "esmfold-v1": _V1}


def esmfold_config(name: str) -> Any:
    """transformers' ``EsmConfig`` of a named configuration (no download)."""
    from transformers import EsmConfig
    if name not in CONFIGS:
        raise unknown_name("ESMFold configuration", name, CONFIGS)
    c = CONFIGS[name]
    return EsmConfig(vocab_size=33, hidden_size=c["hidden_size"], num_hidden_layers=c["num_hidden_layers"],
                     num_attention_heads=c["num_attention_heads"], intermediate_size=c["intermediate_size"],
                     max_position_embeddings=1026, position_embedding_type="rotary", token_dropout=True,
                     mask_token_id=32, pad_token_id=1, emb_layer_norm_before=False, is_folding_model=True,
                     vocab_list=_ESM2_VOCAB,
                     esmfold_config={"fp16_esm": c["fp16_esm"], "lddt_head_hid_dim": c["lddt_head_hid_dim"],
                                     "trunk": c["trunk"]})


#: ESM-2's token list (transformers' ``EsmFoldConfig`` default when none is given)
_ESM2_VOCAB = ("<cls>", "<pad>", "<eos>", "<unk>", "L", "A", "G", "V", "S", "E", "R", "T", "I", "D", "P", "K",
               "Q", "N", "F", "Y", "M", "H", "W", "C", "X", "B", "U", "Z", "O", ".", "-", "<null_1>", "<mask>")


def build(name: str = "esmfold-tiny", device: str | torch.device = "cpu", seed: int = 0) -> nn.Module:
    """The model in eval mode, random weights on ``device`` (``"meta"``: shapes only)."""
    from transformers import EsmForProteinFolding
    config = esmfold_config(name)
    torch.manual_seed(seed)
    with torch.device(device):
        return EsmForProteinFolding(config).eval()


def inputs(seq_len: int, device: str | torch.device = "meta") -> torch.Tensor:
    """One sequence of ``seq_len`` residues (AlphaFold indices; values are irrelevant on meta)."""
    return torch.zeros(1, seq_len, dtype=torch.long, device=device)
