"""Issue 36 item 2: chat / instruction SFT data - the tokenizer's own chat template, loss on
the assistant's tokens only, packing with position ids per sample and no attention across
samples (checked against the same samples unpacked, and by perturbing a neighbour)."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from partita.errors import PartitaError  # noqa: E402
from partita.plan import Plan  # noqa: E402
from partita.train import sft_data  # noqa: E402

CHATS = [
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
     {"role": "assistant", "content": "hello world"}, {"role": "user", "content": "and then?"},
     {"role": "assistant", "content": "then the end"}],
    [{"role": "user", "content": "what is two plus two"}, {"role": "assistant", "content": "four"}],
    [{"role": "user", "content": "name a colour"}, {"role": "assistant", "content": "blue, or green"}],
]


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    texts = [m["content"] for c in CHATS for m in c] * 20 + ["system user assistant"] * 20
    root = tmp_path_factory.mktemp("tok")
    gen = sft_data.build_chat_tokenizer(root / "gen", texts, 300)
    plain = sft_data.build_chat_tokenizer(root / "plain", texts, 300, sft_data.CHATML)
    return sft_data.load_chat_tokenizer(gen), sft_data.load_chat_tokenizer(plain)


@pytest.fixture(scope="module")
def model():
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_assistant_tokens_are_the_answers(tok_dirs):
    gen, plain = tok_dirs
    for msgs in CHATS:
        ids_g, mask_g = sft_data.assistant_mask(gen, msgs)    # transformers' {% generation %} mask
        ids_p, mask_p = sft_data.assistant_mask(plain, msgs)  # prefix lengths
        assert ids_g == ids_p and mask_g == mask_p
        learned = gen.decode([i for i, m in zip(ids_g, mask_g) if m])
        assert learned == "".join(m["content"] + "<|im_end|>" for m in msgs if m["role"] == "assistant")


def _token_losses(model, x, y, pos=None):
    with torch.no_grad():
        logits = model(input_ids=x, position_ids=pos, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)


def test_packing_changes_no_loss_and_blocks_attention(tok_dirs, model):
    gen, _ = tok_dirs
    samples = [sft_data.sample_arrays(*sft_data.assistant_mask(gen, m), 128)[:2] for m in CHATS]
    packed = sft_data.pack(samples, 128, gen.pad_token_id)
    single = sft_data.pack(samples, 128, gen.pad_token_id, packing=False)
    assert packed["inputs"].shape[0] == 1 and single["inputs"].shape[0] == 3
    t = {k: torch.from_numpy(v) for k, v in packed.items()}
    u = {k: torch.from_numpy(v) for k, v in single.items()}
    lp = _token_losses(model, t["inputs"], t["targets"], t["positions"])
    lu = _token_losses(model, u["inputs"], u["targets"], u["positions"])
    assert (t["targets"] != -100).sum() == (u["targets"] != -100).sum()
    assert torch.allclose(lp.sum(), lu.sum(), atol=1e-5)
    assert torch.allclose(lp[t["targets"] != -100], lu[u["targets"] != -100], atol=1e-5)
    # a token cannot attend across the boundary: change sample 1, sample 2's logits stay
    # (use_cache=False, as the runtime calls the model: transformers reads packed position ids without a cache)
    n1 = len(samples[0][0])
    bad = t["inputs"].clone()
    bad[0, :n1] = (bad[0, :n1] + 7) % 280
    with torch.no_grad():
        a = model(input_ids=t["inputs"], position_ids=t["positions"], use_cache=False).logits[0, n1:]
        b = model(input_ids=bad, position_ids=t["positions"], use_cache=False).logits[0, n1:]
        plain_causal = model(input_ids=bad, use_cache=False).logits[0, n1:]  # control: one causal sequence does leak
        explicit = model(input_ids=bad, position_ids=t["positions"], use_cache=False,
                         attention_mask=sft_data.document_mask(t["positions"])).logits[0, n1:]
    assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    assert not torch.allclose(a, plain_causal, atol=1e-3)
    assert torch.allclose(explicit, b, atol=1e-5)  # the explicit mask = transformers' packed mask


def test_instruction_form_and_epochs(tmp_path, tok_dirs):
    gen, _ = tok_dirs
    data = tmp_path / "alpaca.jsonl"
    data.write_text("\n".join(json.dumps({"instruction": f"say {w}", "input": "", "output": w})
                              for w in ("hello", "world", "blue")) + "\n")
    assert sft_data.is_sft_file(data)
    arrays = sft_data.encode_file(data, gen, 48, packing=False)
    rows = sft_data.SftRows(arrays, seed=0)
    assert rows.n == 3 and int(arrays["samples"]) == 3
    plan = Plan.parse("dp=1,gbs=2,mbs=1,seq_len=48", world_size=1)
    seen = [tuple(rows.rank_batch(s, plan, 0)[0][:, 0].tolist()) for s in range(3)]  # 6 rows = 2 epochs
    firsts = [r for s in seen for r in s]
    assert len(firsts) == 6
    x, y, pos = rows.rank_batch(0, plan, 0)
    assert x.shape == (2, 48) and pos[:, 0].eq(0).all()
    learned = gen.decode([int(i) for i in y[0] if i != -100])
    assert learned.replace("<|im_end|>", "") in ("hello", "world", "blue")


@pytest.mark.parametrize("text,msg", [
    ("", "holds no samples"),
    ('{"prompt": "x"}', 'needs "messages"'),
    ('{"instruction": "x"}', 'needs an "output"'),
    ('{"messages": [{"role": "user", "content": "x"}]}', "no assistant turn"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', '"role" in'),
    ('not json', "not JSON"),
])
def test_bad_input_is_one_line(tmp_path, text, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(PartitaError) as e:
        sft_data.read_samples(f)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_document_mask():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    m = sft_data.document_mask(pos)[0, 0]
    expect = np.array([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                       [0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 0, 1]], dtype=bool)
    assert (m.numpy() == expect).all()
