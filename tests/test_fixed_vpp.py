"""A fixed ``vpp`` the pipeline cannot hold ends in one line naming the constraint.

Every one of the ``pp * vpp`` model chunks needs a layer (the embedding and the loss count as
one each at the ends: ``pp * vpp <= layers + 2``), so the search never enumerates a structure
that breaks it; before, ``partita plan --pp 16 --vpp 8`` on an 80-layer model explained the
empty search with an unrelated candidate's reason (a tp=16 KV-head line), and a fixed vpp
with pp left free fell back to pp 1 plans, which have no virtual stages. Expected values are
counted by hand from the layer counts (llama3-70b: 80 layers, 8 KV heads; tiny-llama: 4)."""
from __future__ import annotations

import json

import pytest

from partita.cli.main import main
from partita.plan import Plan

LLAMA70 = ["--model", "llama3-70b", "--hardware", "h100-sxm", "--devices", "512", "--global-batch", "1024",
           "--seq-len", "4096"]


@pytest.mark.parametrize("flags,says", [
    # 16*8 = 128 chunks > 82; vpp <= 82 // 16 = 5, and 80 = 16*5 is the one even split
    (["--pp", "16", "--vpp", "8"], "so vpp <= 5 with pp 16; the vpp values that split the layers evenly with pp 16: 5"),
    # 32*4 = 128 > 82; vpp <= 82 // 32 = 2, and neither 80 nor 82 is a multiple of 64
    (["--pp", "32", "--vpp", "4"], "so vpp <= 2 with pp 32; no vpp > 1 splits them evenly with pp 32"),
    # 64*2 = 128 > 82: no vpp > 1 at all
    (["--pp", "64", "--vpp", "2"], "pp 64 leaves no room for interleaving"),
    # pp free: even pp 2 gives 2*64 = 128 > 82; vpp <= 41 at pp 2
    (["--vpp", "64"], "so vpp <= 41 with pp 2 (the shallowest pipeline)"),
])
def test_a_vpp_the_layers_cannot_hold_ends_in_one_line(capsys, flags, says) -> None:
    assert main(["plan", *LLAMA70, *flags, "--top", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "KV heads" not in err
    assert "every chunk needs a layer (pp*vpp at most 82" in err and says in err, err


def test_a_fixed_vpp_is_kept_when_pp_is_searched(capsys) -> None:
    """--vpp 2 with pp free: every plan has the two virtual stages asked for (a pp 1 plan
    cannot), and a vpp the layers allow at pp 2 (3: 6 chunks, tiny-llama's 4 layers + 2) is
    searched, not refused."""
    argv = ["plan", "--model", "tiny-llama", "--hardware", "h100-sxm", "--devices", "8", "--global-batch", "16",
            "--seq-len", "256", "--top", "20", "--json", "--grad-knobs", "none"]
    assert main([*argv, "--vpp", "2"]) == 0
    plans = [Plan.from_dict(row["plan"]) for row in json.loads(capsys.readouterr().out)["plans"]]
    assert plans and all(p.vpp == 2 and p.pp > 1 for p in plans)
    assert main([*argv, "--vpp", "4"]) == 2  # 2*4 = 8 chunks > 6
    assert "so vpp <= 3 with pp 2" in capsys.readouterr().err
