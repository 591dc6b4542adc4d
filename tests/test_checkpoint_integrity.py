"""Issue 21: checkpoints you can trust - damage is detected, resume falls back to the newest
good checkpoint bit-exactly, damaged ones are renamed (never deleted), the keep rule never
deletes the last verified checkpoint, a failed save is one line.

Every scenario runs at the library level on 2 gloo ranks, in the session's shared 2-rank
processes (tests/conftest.py ``equivalence``; this file's ``shared_case``, or under a torchrun
of its own through ``main``): it trains tiny-llama under tp=2 (DTensor shards on both ranks)
with SGD + momentum, saves step 0 (state A) and step 1 (state B), then for each scenario
copies those two checkpoints, damages step 1 in one way, sets the live model to B and
resumes. The oracle is the tensors themselves: after a fallback the loaded parameters and
momentum buffers must equal A with ``torch.equal`` on every rank.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

STEP0, STEP1 = "step_00000000", "step_00000001"

#: scenario -> (file named in the warning line, what resume must return)
FALLBACK = {
    "flipped-tensor-bytes": "__0_0.distcp",
    "random-bytes": "__1_0.distcp",
    "truncated": "__0_0.distcp",
    "missing": "__1_0.distcp",
    "garbage-metadata": ".metadata",
    "bad-manifest": "MANIFEST.json",
    "nan-in-tensor": "is not finite",
    "legacy-truncated": "load failed",
    "legacy-garbage-metadata": ".metadata",
}


#: every scenario is one case of the session's shared 2-rank processes (no torchrun of its own)
EQUIVALENCE_CASES = [(2, 0, "all", str(Path(__file__).resolve()))]


@pytest.fixture(scope="module")
def results(equivalence) -> dict:
    return equivalence["results"][EQUIVALENCE_CASES[0]]


@pytest.mark.parametrize("scenario", sorted(FALLBACK))
def test_damaged_newest_falls_back_to_previous_bit_exactly(results, scenario):
    r = results[scenario]
    assert r["error"] is None, r
    assert r["step"] == 0
    assert r["equal_A_all_ranks"] is True          # loaded tensors == the ones saved at step 0
    assert sorted(r["dirs"]) == sorted([STEP0, "corrupt-" + STEP1])
    warnings = [line for line in r["lines"] if "warning" in line]
    assert len(warnings) == 1, r["lines"]
    assert FALLBACK[scenario] in warnings[0] and STEP1 in warnings[0] and "renamed to corrupt-" in warnings[0]
    assert "\n" not in warnings[0]


def test_flipped_bytes_load_silently_without_the_checksum(results):
    """The oracle for the flip scenario: DCP itself loads the damaged file without an error and
    gives other values than were saved - only the manifest's CRC-32 tells."""
    r = results["flipped-tensor-bytes"]
    assert r["plain_load_raised"] is False
    assert r["plain_load_equal_B"] is False
    assert r["plain_load_finite"] is True


def test_intact_legacy_checkpoint_loads_with_a_note(results):
    r = results["legacy-intact"]
    assert r["error"] is None and r["step"] == 1 and r["equal_B_all_ranks"] is True
    assert sorted(r["dirs"]) == [STEP0, STEP1]
    assert any("no MANIFEST.json" in line and STEP1 in line for line in r["lines"]), r["lines"]


def test_intact_checkpoint_resumes_newest_without_warnings(results):
    r = results["intact"]
    assert r["error"] is None and r["step"] == 1 and r["equal_B_all_ranks"] is True
    assert r["lines"] == [] and sorted(r["dirs"]) == [STEP0, STEP1]


def test_only_damaged_checkpoints_is_one_error_line(results):
    r = results["all-damaged"]
    assert r["step"] is None
    assert r["error_all_ranks"] is True
    assert r["error"].startswith("no usable checkpoint in ") and "\n" not in r["error"]
    assert sorted(r["dirs"]) == ["corrupt-" + STEP0, "corrupt-" + STEP1]  # renamed, never deleted
    assert len([line for line in r["lines"] if "warning" in line]) == 2


def test_another_model_is_refused_without_renaming_anything(results):
    r = results["another-model"]
    assert r["step"] is None and r["error_all_ranks"] is True
    assert "holds another model" in r["error"] and "\n" not in r["error"]
    assert sorted(r["dirs"]) == [STEP0, STEP1]


def test_newest_verified_without_loading_and_a_second_corrupt_name(results):
    r = results["newest-verified"]
    assert r["found_step"] == 0 and r["found_name"] == STEP0
    assert sorted(r["dirs"]) == ["corrupt-" + STEP1, "corrupt-" + STEP1 + ".1", STEP0]  # the older one kept too
    assert r["equal_B_all_ranks"] is True  # nothing was loaded


def test_keep_rule_counts_only_verified_and_never_touches_the_rest(results):
    r = results["keep-rule"]
    # before: step 0 verified, step 1 damaged (bad manifest), step 2 partial, a corrupt-* dir
    assert r["after_save_3"] == ["corrupt-step_00000009", STEP0, STEP1, "step_00000002.partial", "step_00000003"]
    assert r["after_save_4"] == ["corrupt-step_00000009", STEP1, "step_00000002.partial", "step_00000003",
                                 "step_00000004"]


def test_keep_one_never_deletes_the_newest_verified(results):
    r = results["keep-one"]
    assert r["dirs"] == ["step_00000005"]
    assert r["equal_saved_all_ranks"] is True


def test_failed_save_is_one_line_and_leaves_checkpoints_intact(results):
    for case in ("save-file-too-large", "save-dir-not-creatable"):
        r = results[case]
        assert r["error_all_ranks"] is True, case
        assert "\n" not in r["error"]
        assert r["error"].startswith("could not "), r["error"]
        assert r["names_dir"] is True, r["error"]
        assert STEP0 in r["dirs"] and STEP1 in r["dirs"], r["dirs"]
        assert r["resume_step"] == 1 and r["equal_B_all_ranks"] is True, case


def test_nonfinite_state_is_never_saved(results):
    r = results["save-nan"]
    assert r["error_all_ranks"] is True
    assert r["error"].startswith("refusing to save checkpoint step 7: model.") and "not finite" in r["error"]
    assert r["dirs"] == [STEP0, STEP1]


@pytest.mark.parametrize("case,algorithm", [("manifest", "xxh3_64"), ("manifest-crc32", "crc32")])
def test_manifest_lists_every_file_with_size_and_hash(results, case, algorithm):
    """Independent oracle: every file of the checkpoint reread and hashed here with the
    reference implementations (xxhash's one-shot XXH3-64, zlib's CRC-32); a manifest edited
    by hand fails its own CRC-32."""
    import zlib

    import xxhash
    reference = {"xxh3_64": xxhash.xxh3_64_hexdigest, "crc32": lambda d: f"{zlib.crc32(d):08x}"}[algorithm]
    r = results[case]
    manifest = json.loads(Path(r["path"], "MANIFEST.json").read_text())
    on_disk = sorted(p.name for p in Path(r["path"]).iterdir() if p.name != "MANIFEST.json")
    assert sorted(manifest["files"]) == on_disk
    assert {".metadata", "meta.json", "__0_0.distcp", "__1_0.distcp"} <= set(on_disk)
    for name, rec in manifest["files"].items():
        data = Path(r["path"], name).read_bytes()
        assert rec["size"] == len(data) and rec[algorithm] == reference(data), name
    assert manifest["checksum"] == [algorithm]
    assert manifest["step"] == 1 and manifest["world_size"] == 2 and manifest["meta"]["note"] == "B"
    body = {k: v for k, v in manifest.items() if k != "manifest_crc32"}
    assert manifest["manifest_crc32"] == f"{zlib.crc32(json.dumps(body, indent=1, sort_keys=True).encode()):08x}"


def test_crc32_checkpoint_falls_back_too(results):
    """Without xxhash, checkpoints are hashed with zlib.crc32 and verified the same way."""
    r = results["crc32-flipped"]
    assert r["step"] == 0 and r["equal_A_all_ranks"] is True
    assert sorted(r["dirs"]) == sorted([STEP0, "corrupt-" + STEP1])
    assert any("__0_0.distcp: checksum mismatch (crc32" in line for line in r["lines"]), r["lines"]


# ---------------------------------------------------------------- the rank side (torchrun)

def _setup():
    import torch

    from partita.models.llama import build_model
    from partita.plan import Plan
    from partita.runtime import parallelize
    from partita.train.data import dp_shard, synthetic_batch
    plan = Plan.parse("tp=2,gbs=2,mbs=1,seq_len=16", world_size=2, defaults={"dtype": "fp32"})
    pm = parallelize(build_model("tiny-llama", seed=0), plan,
                     make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    rank = torch.distributed.get_rank()

    def step(i: int) -> None:
        x, y = synthetic_batch(i, plan.gbs, plan.seq_len, 256, 0)
        pm.train_step(dp_shard(x, plan, rank), dp_shard(y, plan, rank))
    return pm, step


def _snapshot(pm) -> dict:
    from partita.runtime.checkpoint import state_for_checkpoint
    from partita.runtime.checkpoint_finite import _local
    return {k: _local(v).detach().clone() for k, v in state_for_checkpoint(pm).items()}


def _set_state(pm, snap: dict) -> None:
    import torch

    from partita.runtime.checkpoint import state_for_checkpoint
    from partita.runtime.checkpoint_finite import _local
    with torch.no_grad():
        for k, v in state_for_checkpoint(pm, init_optimizer=True).items():
            _local(v).copy_(snap[k])


def _equal_everywhere(pm, snap: dict) -> bool:
    import torch

    from partita.runtime.checkpoint_integrity import gather
    now = _snapshot(pm)
    mine = now.keys() == snap.keys() and all(torch.equal(now[k], snap[k]) for k in snap)
    return all(gather(mine))


def _payload_offset(path: Path, value) -> int:
    """Where the raw bytes of a tensor we saved start inside a .distcp file (the tensor data
    of a zip record; its headers and central directory are left alone)."""
    data = path.read_bytes()
    at = data.find(value.contiguous().numpy().tobytes())
    assert at > 0, f"tensor bytes not found in {path}"
    return at


def _largest(snap: dict) -> str:
    return max((k for k in snap if k.startswith("model.")), key=lambda k: snap[k].numel())


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _flip(d: Path, snaps: dict) -> None:
    """Lowest mantissa bit of 16 float32 values: finite, different, zip intact."""
    f = d / "__0_0.distcp"
    at = _payload_offset(f, snaps["B"][_largest(snaps["B"])])
    raw = bytearray(f.read_bytes()[at:at + 64])
    for i in range(0, 64, 4):
        raw[i] ^= 1
    _overwrite(f, at, bytes(raw))


def _nan(d: Path, snaps: dict) -> None:
    """NaN in a tensor with a manifest that matches it: only the finite check can tell."""
    from partita.runtime.checkpoint_storage import MANIFEST, FileRecord, build_manifest, file_digest, record_algorithm
    f = d / "__0_0.distcp"
    _overwrite(f, _payload_offset(f, snaps["B"][_largest(snaps["B"])]), b"\xff" * 16)
    m = json.loads((d / MANIFEST).read_text())
    records = {n: FileRecord(r["size"], r[record_algorithm(r)], r["rank"], record_algorithm(r))
               for n, r in m["files"].items()}
    algorithm = records[f.name].algorithm
    size, digest = file_digest(f, algorithm)
    records[f.name] = FileRecord(size, digest, 0, algorithm)
    (d / MANIFEST).write_text(json.dumps(build_manifest(m["step"], m["world_size"], records, m["meta"])))


def _to_legacy(d: Path) -> None:
    (d / "MANIFEST.json").unlink()
    (d / "COMMITTED").write_text("ok\n")


def _random_bytes(f: Path) -> None:
    size = f.stat().st_size
    _overwrite(f, size // 4, os.urandom(min(4096, size // 2)))


def _damage(kind: str, d: Path, snaps: dict) -> None:
    if kind == "flipped-tensor-bytes":
        _flip(d, snaps)
    elif kind == "random-bytes":
        _random_bytes(d / "__1_0.distcp")
    elif kind in ("truncated", "legacy-truncated"):
        f = d / "__0_0.distcp"
        os.truncate(f, f.stat().st_size // 2)
    elif kind == "missing":
        (d / "__1_0.distcp").unlink()
    elif kind in ("garbage-metadata", "legacy-garbage-metadata"):
        f = d / ".metadata"
        f.write_bytes(os.urandom(f.stat().st_size))
    elif kind == "bad-manifest":
        (d / "MANIFEST.json").write_text('{"format": "partita-checkpoint", "files": ')
    elif kind == "nan-in-tensor":
        _nan(d, snaps)


def _attempt(fn, pm_target, snaps) -> dict:
    """Run a collective call that may raise PartitaError; the outcome as seen by every rank."""
    from partita.errors import PartitaError
    from partita.runtime.checkpoint_integrity import gather
    try:
        out, error = fn(), None
    except PartitaError as e:
        out, error = None, str(e)
    errs = gather(error)
    return {"out": out, "error": errs[0], "error_all_ranks": all(e is not None for e in errs)}


def _resume_case(name: str, master: Path, work: Path, pm, snaps: dict, pm_other=None) -> dict:
    import shutil

    import torch.distributed as dist

    from partita.runtime.checkpoint_resume import resume_checkpoint
    d = work / name
    rank = dist.get_rank()
    if rank == 0:
        shutil.copytree(master, d)
        if name.startswith("legacy"):
            _to_legacy(d / STEP0)
            _to_legacy(d / STEP1)
        if name == "all-damaged":
            _random_bytes(d / STEP0 / "__0_0.distcp")
            _random_bytes(d / STEP1 / "__1_0.distcp")
        else:
            _damage(name, d / STEP1, snaps)
    dist.barrier()
    extra = {}
    if name == "flipped-tensor-bytes":
        extra = _plain_load(pm, d / STEP1, snaps)
    target = pm_other or pm
    _set_state(pm, snaps["B"] if name not in ("intact", "legacy-intact") else snaps["A"])
    lines: list[str] = []
    got = _attempt(lambda: resume_checkpoint(target, d, report=lines.append), target, snaps)
    dist.barrier()
    return {"step": got["out"][0] if got["out"] else None, "error": got["error"],
            "error_all_ranks": got["error_all_ranks"], "lines": lines,
            "equal_A_all_ranks": _equal_everywhere(pm, snaps["A"]),
            "equal_B_all_ranks": _equal_everywhere(pm, snaps["B"]),
            "dirs": sorted(os.listdir(d)), **extra}


def _newest_verified(pm, snaps: dict, master: Path, work: Path) -> dict:
    import shutil

    import torch.distributed as dist

    from partita.runtime.checkpoint_resume import newest_verified_checkpoint
    d = work / "newest-verified"
    if dist.get_rank() == 0:
        shutil.copytree(master, d)
        (d / ("corrupt-" + STEP1)).mkdir()  # left by an earlier resume
        _random_bytes(d / STEP1 / "__1_0.distcp")
    dist.barrier()
    _set_state(pm, snaps["B"])
    found = newest_verified_checkpoint(d)
    dist.barrier()
    return {"found_step": found[0], "found_name": found[1].name, "dirs": sorted(os.listdir(d)),
            "equal_B_all_ranks": _equal_everywhere(pm, snaps["B"])}


def _plain_load(pm, path: Path, snaps: dict) -> dict:
    """What DCP alone does with the flipped file: loads it, no error, other values."""
    import torch

    from partita.runtime.checkpoint import load_checkpoint
    from partita.runtime.checkpoint_integrity import gather
    _set_state(pm, snaps["A"])
    try:
        load_checkpoint(pm, path)
        raised = False
    except BaseException:  # noqa: BLE001 - recording whether it raised at all
        raised = True
    return {"plain_load_raised": raised, "plain_load_equal_B": _equal_everywhere(pm, snaps["B"]),
            "plain_load_finite": all(gather(all(bool(torch.isfinite(t).all()) for t in _snapshot(pm).values())))}


def _keep_cases(pm, snaps: dict, master: Path, work: Path) -> dict:
    import shutil

    import torch.distributed as dist

    from partita.runtime.checkpoint import save_checkpoint
    out = {}
    d = work / "keep-rule"
    if dist.get_rank() == 0:
        shutil.copytree(master, d)
        (d / STEP1 / "MANIFEST.json").write_text("garbage")
        (d / "step_00000002.partial").mkdir()
        (d / "corrupt-step_00000009").mkdir()
    dist.barrier()
    save_checkpoint(pm, d, 3, {"note": "3"}, keep=2)
    out["after_save_3"] = sorted(os.listdir(d))
    save_checkpoint(pm, d, 4, {"note": "4"}, keep=2)
    out["after_save_4"] = sorted(os.listdir(d))
    d1 = work / "keep-one"
    if dist.get_rank() == 0:
        shutil.copytree(master, d1)
    dist.barrier()
    _set_state(pm, snaps["A"])
    save_checkpoint(pm, d1, 5, {"note": "5"}, keep=1)
    from partita.runtime.checkpoint_resume import resume_checkpoint
    _set_state(pm, snaps["B"])
    step = resume_checkpoint(pm, d1)[0]
    out["keep-one"] = {"dirs": sorted(os.listdir(d1)), "step": step,
                       "equal_saved_all_ranks": _equal_everywhere(pm, snaps["A"])}
    return out


def _failed_save(name: str, pm, snaps: dict, master: Path, work: Path) -> dict:
    """A save that fails mid-write (file-size limit, as a full disk) or cannot create its
    directory; then the earlier checkpoints must still resume."""
    import resource
    import shutil
    import signal

    import torch.distributed as dist

    from partita.runtime.checkpoint import save_checkpoint
    from partita.runtime.checkpoint_resume import resume_checkpoint
    d = work / name
    if dist.get_rank() == 0:
        shutil.copytree(master, d)
    dist.barrier()
    root = d
    if name == "save-dir-not-creatable":
        root = d / STEP0 / "meta.json" / "sub"  # a path through a regular file
        got = _attempt(lambda: save_checkpoint(pm, root, 2, {}, keep=1), pm, snaps)
    else:
        old = resource.getrlimit(resource.RLIMIT_FSIZE)
        # restored below: this runs in the session's shared equivalence processes (other files' cases next)
        old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, old[1]))
        try:
            got = _attempt(lambda: save_checkpoint(pm, root, 2, {}, keep=1), pm, snaps)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, old)
            signal.signal(signal.SIGXFSZ, old_handler)
    dist.barrier()
    _set_state(pm, snaps["A"])
    step = resume_checkpoint(pm, d)[0]
    return {"error": got["error"], "error_all_ranks": got["error_all_ranks"],
            "names_dir": got["error"] is not None and str(root) in got["error"],
            "dirs": sorted(os.listdir(d)), "resume_step": step,
            "equal_B_all_ranks": _equal_everywhere(pm, snaps["B"])}


def _save_nan(pm, snaps: dict, master: Path, work: Path) -> dict:
    import shutil

    import torch
    import torch.distributed as dist

    from partita.runtime.checkpoint import save_checkpoint
    d = work / "save-nan"
    if dist.get_rank() == 0:
        shutil.copytree(master, d)
    dist.barrier()
    bad = {k: v.clone() for k, v in snaps["B"].items()}
    key = _largest(bad)
    if dist.get_rank() == 1:
        bad[key].view(-1)[3] = torch.nan
    _set_state(pm, bad)
    got = _attempt(lambda: save_checkpoint(pm, d, 7, {}, keep=1), pm, snaps)
    dist.barrier()
    return {"error": got["error"], "error_all_ranks": got["error_all_ranks"], "dirs": sorted(os.listdir(d))}


def _another_model(work: Path):
    import torch

    from partita.models.llama import TransformerConfig, build_model
    from partita.plan import Plan
    from partita.runtime import parallelize
    plan = Plan.parse("tp=2,gbs=2,mbs=1,seq_len=16", world_size=2, defaults={"dtype": "fp32"})
    return parallelize(build_model(TransformerConfig(layers=2), seed=1), plan,
                       make_optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))


def _crc32_case(pm, step, snaps: dict, work: Path) -> tuple[dict, dict]:
    """The same states saved with zlib.crc32 (as without xxhash), then the flip scenario."""
    from partita.runtime import checkpoint_storage
    from partita.runtime.checkpoint import save_checkpoint
    master = work / "master-crc32"
    preferred, checkpoint_storage.PREFERRED = checkpoint_storage.PREFERRED, "crc32"
    try:
        _set_state(pm, snaps["A"])
        save_checkpoint(pm, master, 0, {"note": "A"}, keep=0)
        _set_state(pm, snaps["B"])
        save_checkpoint(pm, master, 1, {"note": "B"}, keep=0)
    finally:  # what it was (crc32 where xxhash is missing), for the cases run after this one
        checkpoint_storage.PREFERRED = preferred
    return _resume_case("flipped-tensor-bytes", master, work / "crc32", pm, snaps), {"path": str(master / STEP1)}


def run_all(work: Path) -> dict:
    """Every scenario, in a process group that is up (2 gloo ranks); files under ``work``.
    Rank 0's result is the one reported."""
    from partita.runtime.checkpoint import save_checkpoint
    pm, step = _setup()
    master = work / "master"
    step(0)
    save_checkpoint(pm, master, 0, {"note": "A"}, keep=0)
    snaps = {"A": _snapshot(pm)}
    step(1)
    save_checkpoint(pm, master, 1, {"note": "B"}, keep=0)
    snaps["B"] = _snapshot(pm)
    results = {"manifest": {"path": str(master / STEP1)}}
    results["crc32-flipped"], results["manifest-crc32"] = _crc32_case(pm, step, snaps, work)
    for name in [*FALLBACK, "intact", "legacy-intact", "all-damaged"]:
        results[name] = _resume_case(name, master, work, pm, snaps)
    results["another-model"] = _resume_case("another-model", master, work, pm, snaps, _another_model(work))
    results["newest-verified"] = _newest_verified(pm, snaps, master, work)
    results.update(_keep_cases(pm, snaps, master, work))
    results["keep-rule"] = {k: results.pop(k) for k in ("after_save_3", "after_save_4")}
    for name in ("save-file-too-large", "save-dir-not-creatable"):
        results[name] = _failed_save(name, pm, snaps, master, work)
    results["save-nan"] = _save_nan(pm, snaps, master, work)
    return results


def shared_case(case: str) -> dict:
    """``all``: :func:`run_all` in the session's shared 2-rank processes
    (``partita.runtime.equivalence --worker``), its files under ``$PARTITA_WORKER_DIR``."""
    assert case == "all", case
    return run_all(Path(os.environ["PARTITA_WORKER_DIR"]) / "checkpoint_integrity")


def main() -> None:
    """``torchrun --nproc-per-node=2 tests/test_checkpoint_integrity.py OUT.json WORKDIR``"""
    from datetime import timedelta

    import torch.distributed as dist

    out_path, work = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=180))
    results = run_all(work)
    if dist.get_rank() == 0:
        out_path.write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    main()
