"""Packing and sharding of real text data (no process group needed)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from partita.errors import PartitaError
from partita.plan import Plan
from partita.train.data import PackedTokens, tokenize_to_file, train_tokenizer
from partita.train.schedule import lr_at


def test_ranks_read_disjoint_shares_that_tile_the_global_batch(tmp_path):
    tokens = np.arange(10_000, dtype=np.uint16) % 256
    np.save(tmp_path / "t.npy", tokens)
    ds = PackedTokens(tmp_path / "t.npy", seq_len=16, seed=0, vocab=256)
    plan = Plan(dp=2, tp=2, gbs=8, mbs=1, seq_len=16)
    shares = [ds.rank_batch(3, plan, rank)[0] for rank in range(4)]
    assert torch.equal(shares[0], shares[1]) and torch.equal(shares[2], shares[3])  # tp ranks share the data
    full = ds.sequences(3 * 8, 8)[:, :-1]
    assert torch.equal(torch.cat([shares[0], shares[2]]), full)
    x, y = ds.rank_batch(0, Plan(dp=1, gbs=2, mbs=1, seq_len=16), 0)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens


def test_bpe_tokenizer_round_trips_text(tmp_path):
    text = "the quick brown fox jumps over the lazy dog. " * 200
    tok = train_tokenizer([text], 300)
    assert tok.get_vocab_size() <= 300
    assert tok.decode(tok.encode("the lazy dog").ids) == "the lazy dog"
    (tmp_path / "a.txt").write_text(text)
    path = tokenize_to_file(str(tmp_path / "a.txt"), 300, str(tmp_path))
    assert np.load(path).max() < 300
    assert tokenize_to_file(str(tmp_path / "a.txt"), 300, str(tmp_path)) == path  # cached


def test_bad_data_is_one_clear_error(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"txt": "x"}\n')
    with pytest.raises(PartitaError, match='"text" field'):
        tokenize_to_file(str(tmp_path / "bad.jsonl"), 256, str(tmp_path))
    with pytest.raises(PartitaError, match="does not exist"):
        tokenize_to_file(str(tmp_path / "missing.txt"), 256, str(tmp_path))


def test_warmup_cosine_schedule():
    assert lr_at(0, 1.0, 10, 100, kind="cosine") == pytest.approx(0.1)
    assert lr_at(9, 1.0, 10, 100, kind="cosine") == pytest.approx(1.0)
    assert lr_at(55, 1.0, 10, 100, 0.1, kind="cosine") == pytest.approx(0.1 + 0.45 * (1 + np.cos(np.pi * 0.5)))
    assert lr_at(100, 1.0, 10, 100, 0.1, kind="cosine") == pytest.approx(0.1)
