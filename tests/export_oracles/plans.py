"""The export matrix of issue 14: dense and MoE; tp/pp/vpp/uneven split/cp/ep/etp; zero 0-3;
recompute none/selective/full; bf16/fp16/fp8/fp32. ``(id, model name, Plan)``."""
from partita.plan import Plan

L8 = "llama3-8b"
MATRIX = [
    ("8b-dp8-z0", L8, Plan(dp=8, zero=0, mbs=2, gbs=64, seq_len=4096)),
    ("8b-dp8-z1-sel", L8, Plan(dp=8, zero=1, mbs=2, gbs=64, seq_len=4096, recompute="selective")),
    ("8b-dp8-z2-full", L8, Plan(dp=8, zero=2, mbs=2, gbs=64, seq_len=4096, recompute="full")),
    ("8b-dp8-z3", L8, Plan(dp=8, zero=3, mbs=2, gbs=64, seq_len=4096)),
    ("8b-dp8-z3-fp16-full", L8, Plan(dp=8, zero=3, mbs=1, gbs=64, dtype="fp16", recompute="full")),
    ("8b-dp8-z0-fp16", L8, Plan(dp=8, zero=0, mbs=1, gbs=32, dtype="fp16")),
    ("8b-dp8-z1-fp32", L8, Plan(dp=8, zero=1, mbs=1, gbs=32, dtype="fp32")),
    ("8b-dp8-z1-fp8", L8, Plan(dp=8, zero=1, mbs=1, gbs=32, dtype="fp8")),
    ("8b-tp4-sp-z1-sel", L8, Plan(dp=2, tp=4, sp=True, zero=1, mbs=1, gbs=16, seq_len=8192, recompute="selective")),
    ("8b-tp2-z3-fp8", L8, Plan(dp=4, tp=2, sp=True, zero=3, mbs=1, gbs=32, dtype="fp8")),
    ("8b-tp2-pp2-fp16-full", L8, Plan(dp=2, tp=2, pp=2, zero=1, mbs=1, gbs=16, dtype="fp16", recompute="full")),
    ("8b-pp2-gpipe", L8, Plan(dp=2, tp=2, pp=2, zero=0, mbs=1, gbs=16, schedule="gpipe")),
    ("8b-pp4-vpp2", L8, Plan(dp=2, pp=4, vpp=2, zero=1, mbs=1, gbs=32, schedule="interleaved-1f1b")),
    ("8b-pp4-vpp4-z0", L8, Plan(dp=1, tp=2, pp=4, vpp=4, zero=0, mbs=1, gbs=16, schedule="interleaved-1f1b")),
    ("8b-pp2-vpp2-zb", L8, Plan(dp=2, pp=2, vpp=2, zero=1, mbs=1, gbs=16, schedule="zero-bubble")),
    ("8b-cp2-tp2-pp2", L8, Plan(dp=2, tp=2, pp=2, cp=2, sp=True, zero=1, mbs=1, gbs=16, seq_len=16384)),
    ("8b-pp2-z2", L8, Plan(dp=4, pp=2, zero=2, mbs=1, gbs=32)),
    ("8b-pp2-z3-full", L8, Plan(dp=4, pp=2, zero=3, mbs=1, gbs=32, recompute="full")),
    ("8b-dp64-z3-mbs2", L8, Plan(dp=64, zero=3, mbs=2, gbs=128, seq_len=8192)),
    ("70b-tp8-pp4-vpp5", "llama3-70b", Plan(dp=4, tp=8, pp=4, vpp=5, sp=True, zero=1, mbs=1, gbs=128, seq_len=8192,
                                            recompute="selective", schedule="interleaved-1f1b")),
    ("70b-pp2-split", "llama3-70b", Plan(dp=8, tp=8, pp=2, sp=True, zero=1, mbs=1, gbs=128, layer_split=(39, 41))),
    ("175b-pp12-fp16", "gpt3-175b", Plan(dp=16, tp=8, pp=12, sp=True, zero=1, mbs=1, gbs=1536, recompute="full",
                                         dtype="fp16")),
    ("405b-split-cp2", "llama3-405b", Plan(dp=8, tp=8, pp=16, cp=2, sp=True, zero=1, mbs=1, gbs=1024, seq_len=8192,
                                           layer_split=(7,) + (8,) * 14 + (7,))),
    ("405b-split-mid", "llama3-405b", Plan(dp=8, tp=8, pp=16, sp=True, zero=1, mbs=1, gbs=1024, seq_len=8192,
                                           layer_split=(7,) + (8,) * 6 + (7, 9) + (8,) * 6 + (7,))),
    ("8x22b-pp4-ep8-full", "mixtral-8x22b", Plan(dp=8, pp=4, ep=8, zero=1, mbs=1, gbs=256, seq_len=4096,
                                                 recompute="full")),
    ("8x22b-ep8-z0", "mixtral-8x22b", Plan(dp=8, ep=8, zero=0, mbs=1, gbs=64, seq_len=4096)),
    ("8x22b-ep8-z1", "mixtral-8x22b", Plan(dp=8, ep=8, zero=1, mbs=1, gbs=64, seq_len=4096)),
    ("8x22b-tp2-ep4-z3", "mixtral-8x22b", Plan(dp=4, tp=2, ep=4, zero=3, mbs=1, gbs=64, seq_len=4096)),
    ("8x7b-pp4-vpp4-ep4", "mixtral-8x7b", Plan(dp=4, pp=4, vpp=4, ep=4, zero=1, mbs=1, gbs=64, seq_len=4096,
                                               schedule="interleaved-1f1b")),
    ("dsv3-split-ep64", "deepseek-v3", Plan(dp=64, pp=16, ep=64, zero=1, mbs=1, gbs=4096, seq_len=4096,
                                            layer_split=(3,) + (4,) * 14 + (2,))),
    ("dsv3-ep8-z1-sel", "deepseek-v3", Plan(dp=16, tp=2, pp=8, ep=8, zero=1, mbs=1, gbs=512, seq_len=4096,
                                            recompute="selective", layer_split=(7,) + (8,) * 6 + (6,))),
    # expert tensor parallel (MoE parallel folding): etp = tp with ep 8 (Grok-1's published ETP=4 layout), and
    # etp without ep
    ("8x22b-tp4-ep8-etp4", "mixtral-8x22b", Plan(dp=8, tp=4, ep=8, etp=4, sp=True, zero=1, mbs=1, gbs=64,
                                                 seq_len=4096)),
    ("8x7b-tp2-etp2", "mixtral-8x7b", Plan(dp=4, tp=2, etp=2, sp=True, zero=1, mbs=1, gbs=32, seq_len=4096)),
    # no layer_split, layers not divisible by pp*vpp (126 over 16, 61 over 8x2): the automatic split
    ("405b-auto-pp16", "llama3-405b", Plan(dp=8, tp=8, pp=16, sp=True, zero=1, mbs=1, gbs=1024, seq_len=8192)),
    ("dsv3-auto-pp8-vpp2", "deepseek-v3", Plan(dp=16, tp=2, pp=8, vpp=2, ep=8, sp=True, zero=1, mbs=1, gbs=512,
                                               seq_len=4096, schedule="interleaved-1f1b")),
    # partial recompute (recompute_layers, issue 12): Megatron's block method, first N layers of each stage /
    # virtual chunk; dense pp, interleaved (4-layer chunks) and MoE
    # unfused attention (the softmax probabilities kept for backward: Megatron CI's MoE proxy)
    ("8b-tp2-unfused", L8, Plan(dp=4, tp=2, sp=True, zero=1, mbs=1, gbs=32, seq_len=4096, attention="unfused")),
    ("8b-tp2-pp2-full-rl4", L8, Plan(dp=2, tp=2, pp=2, sp=True, zero=1, mbs=1, gbs=16, seq_len=8192, recompute="full",
                                     recompute_layers=4)),
    ("8b-pp4-vpp2-full-rl2", L8, Plan(dp=2, pp=4, vpp=2, zero=1, mbs=1, gbs=32, recompute="full", recompute_layers=2,
                                      schedule="interleaved-1f1b")),
    ("8x7b-pp4-ep4-full-rl3", "mixtral-8x7b", Plan(dp=4, pp=4, ep=4, zero=1, mbs=1, gbs=64, seq_len=4096,
                                                   recompute="full", recompute_layers=3)),
]
