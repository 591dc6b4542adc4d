"""The one line a failed multi-process job is reported with (train/supervise.root_cause),
read from torchrun's own failure summary."""
from partita.train.supervise import root_cause

# torchrun's summary as it prints it when a worker aborts (format of torch.distributed.elastic's
# ChildFailedError), after that worker's C++ "terminate called" lines
ABORTED = """terminate called after throwing an instance of 'gloo::IoException'
  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:1: Connection reset by peer
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
partita.calibrate.hardware_file FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-05_23:10:00
  host      : ci
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 11)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_23:09:59
  host      : ci
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 12)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 12
============================================================"""


def test_an_aborted_rank_is_named_with_its_cpp_exception():
    line = root_cause(ABORTED)
    assert line.startswith("rank 1 died (killed by SIGABRT: C++ exception: [../third_party/gloo")
    assert "Connection closed by peer" in line


def test_a_killed_rank_without_a_message_is_named_as_killed():
    killed = ABORTED.split("torch.distributed.elastic", 1)[1].replace("exitcode  : -6", "exitcode  : -9")
    assert root_cause(killed) == ("rank 1 died (killed by SIGKILL: out of memory, or killed from outside?); "
                                  "the other ranks stopped because they lost it")


def test_a_rank_that_raised_then_aborted_is_named_with_its_error():
    # seen in CI: rank 1 raised, and gloo's teardown then aborted it (SIGABRT, no C++ message);
    # its own Python error is the cause, not the signal
    raised = ("[rank1]: Traceback (most recent call last):\n"
              "[rank1]: RuntimeError: injected crash on rank 1\n"
              + ABORTED.split("\n", 2)[2])
    assert "what():" not in raised
    assert root_cause(raised) == "rank 1 failed: RuntimeError: injected crash on rank 1"
    # another rank's lost-peer error does not count as rank 1's own
    peer_only = ABORTED.split("\n", 2)[2]
    assert root_cause(peer_only).startswith("rank 1 died (killed by SIGABRT: out of memory")
