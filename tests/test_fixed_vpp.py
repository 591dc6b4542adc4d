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


@pytest.mark.parametrize("argv,says", [
    # tp 8 on 8 devices: 8 / 8 = 1 rank left for pp x dp, so pp 1 only; tp 1 would leave pp 2, 4 or 8
    (["--model", "llama3-8b", "--devices", "8", "--tp", "8"],
     "vpp 2 needs pp > 1, but 8 devices with tp 8 leave only pp 1: use vpp 1 or a smaller tp"),
    # one device: pp 1 is all there is
    (["--model", "tiny-llama", "--devices", "1"], "vpp 2 needs pp > 1, but 1 device leaves only pp 1: use vpp 1 or "
                                                  "more devices"),
    # 7 is prime and tiny-llama has 4 layers: pp is 1 or 7, and 7 > 4
    (["--model", "tiny-llama", "--devices", "7"],
     "vpp 2 needs pp > 1, but 7 devices leave only pp 1 (pp divides the devices and is at most tiny-llama's 4 "
     "layers): use vpp 1 or a device count with a divisor from 2 to 4"),
])
def test_a_fixed_vpp_where_only_pp_1_is_possible_says_so(capsys, argv, says) -> None:
    """A fixed vpp > 1 drops every pp 1 structure; where the devices and the fixed degrees allow
    no other pp the line says that, not "no layout divides the devices and the global batch"
    (what the empty search said when the rule assumed a free pp could always be 2)."""
    assert main(["plan", *argv, "--hardware", "h100-sxm", "--vpp", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "global batch" not in err
    assert says in err, err


def test_a_free_pp_is_checked_at_the_shallowest_pipeline_it_can_take() -> None:
    """With pp free the chunk rule is checked at the smallest pp > 1 the devices allow, not at
    2: 9 devices of a 4-layer model allow pp 1 or 3 (9's divisors up to 4, counted by hand), so
    vpp 2 (3 * 2 = 6 chunks <= 4 + 2) is fine and vpp 3 (9 > 6) is not, though pp 2 would hold
    it (6 chunks)."""
    from partita.search.space import SearchSpace, fixed_vpp_problem
    assert fixed_vpp_problem(SearchSpace(vpp=2), "m", 4, devices=9, depths=(1, 3)) is None
    said = fixed_vpp_problem(SearchSpace(vpp=3), "m", 4, devices=9, depths=(1, 3))
    assert "at least 9 model chunks (pp >= 3)" in said and "vpp <= 2 with pp 3" in said, said
    assert fixed_vpp_problem(SearchSpace(vpp=3), "m", 4) is None  # without depths: pp 2 assumed, 6 <= 6
