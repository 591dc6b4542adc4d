"""InternEvo's Python training configs read (never executed) as InternEvo runs them (issue 33 survey,
docs/import_megatron.md "Second survey"). The config is trimmed from InternLM/InternEvo@c628a8c
configs/7B_sft.py; the expected values are read by hand from that commit's
internlm/core/context/parallel_context.py (data parallel = world // pipeline // tensor, zero1 size -1 over
the whole data-parallel group, defaults of absent entries), configs/7B_sft.py's docstring (tensor modes) and
internlm/model/modeling_internlm2.py l.857-861 (checkpoint fraction). Before partita/imports/internevo.py
every InternEvo config was "not a recognised launch config"."""
from __future__ import annotations

from pathlib import Path

import pytest

from partita.errors import PartitaError
from partita.imports import load_config

SFT = '''JOB_NAME = "7b_train"
SEQ_LEN = 2048
HIDDEN_SIZE = 4096
NUM_ATTENTION_HEAD = 32
MLP_RATIO = 8 / 3
NUM_LAYER = 32
VOCAB_SIZE = 103168
CHECKPOINT_EVERY = 50
ckpt = dict(
    enable_save_ckpt=False,
    oss_snapshot_freq=int(CHECKPOINT_EVERY / 2),
)
data = dict(
    seq_len=SEQ_LEN,
    micro_num=4,
    micro_bsz=2,
    valid_micro_num=4,
    pack_sample_into_one=False,
    total_steps=50000,
)
lr_scheduler = dict(
    total_steps=data["total_steps"],
)
model = dict(
    checkpoint=False,  # The proportion of layers for activation aheckpointing, the optional value are True/False/[0-1]
    num_attention_heads=NUM_ATTENTION_HEAD,
    vocab_size=VOCAB_SIZE,
    hidden_size=HIDDEN_SIZE,
    num_layers=NUM_LAYER,
    mlp_ratio=MLP_RATIO,
    dtype="torch.bfloat16",  # Support: "torch.float16", "torch.half", "torch.bfloat16", "torch.float32", "torch.tf32"
    norm_type="rmsnorm",
    use_flash_attn=True,
    num_chunks=1,  # if num_chunks > 1, interleaved pipeline scheduler is used.
)
parallel = dict(
    zero1=dict(size=-1),
    tensor=dict(size=1, mode="mtp"),
    pipeline=dict(size=1, interleaved_overlap=True),
    weight=dict(size=1, overlap=True, memory_pool=True),
)
'''


def _read(tmp_path: Path, text: str, devices: int | None = 8, **kw):
    path = tmp_path / "7B_sft.py"
    path.write_text(text)
    return load_config(str(path), devices=devices, **kw)


def test_7b_sft_as_internevo_runs_it(tmp_path):
    read = _read(tmp_path, SFT)
    p = read.plan
    assert read.framework == "internevo" and p.framework == "internevo"
    assert (p.dp, p.tp, p.pp, p.vpp, p.zero) == (8, 1, 1, 1, 1)  # zero1 size -1: over all 8 dp ranks
    assert (p.mbs, p.gbs, p.seq_len, p.dtype, p.recompute) == (2, 2 * 4 * 8, 2048, "bf16", "none")
    assert "INTERNLM" in read.model_note and "num_layers 32" in read.model_note


def test_tensor_pipeline_chunks_and_checkpoint_fraction(tmp_path):
    text = (SFT.replace('tensor=dict(size=1, mode="mtp")', 'tensor=dict(size=2, mode="msp")')
            .replace("pipeline=dict(size=1,", "pipeline=dict(size=2,").replace("num_chunks=1", "num_chunks=2")
            .replace("checkpoint=False", "checkpoint=0.5").replace("zero1=dict(size=-1)", "zero1=dict(size=1)"))
    p = _read(tmp_path, text, devices=16).plan
    assert (p.dp, p.tp, p.pp, p.vpp, p.sp, p.zero) == (4, 2, 2, 2, True, 0)  # 16 // 2 // 2; zero1 size 1: none
    assert p.schedule == "interleaved-1f1b"
    # 32 layers over pp 2 x 2 chunks = 8 a chunk; lid < 8 * 0.5: the first 4 of each chunk recomputed
    assert (p.recompute, p.recompute_layers) == ("full", 4)


@pytest.mark.parametrize("edit, devices, says", [
    (('mode="mtp"', 'mode="isp"'), 8, "tensor mode isp"),
    (("", ""), None, "pass --devices"),
    (("micro_bsz=2", "micro_bsz=int(SEQ_LEN / 1024)"), 8, "does not evaluate"),
    (("JOB_NAME", "from internlm.utils.utils import read_base\nwith read_base():\n    from configs._base_.x "
                  "import *\nJOB_NAME"), 8, "_base_"),
    (("micro_num=4,", "micro_num=4,\n    micro_bsz=(,"), 8, "not valid Python"),
])
def test_what_is_not_read_is_one_line(tmp_path, edit, devices, says):
    with pytest.raises(PartitaError) as e:
        _read(tmp_path, SFT.replace(*edit, 1) if edit[0] else SFT, devices=devices)
    assert says in str(e.value) and "\n" not in str(e.value)
