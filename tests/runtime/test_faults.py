"""Faults on the CPU emulation: a rank or the launcher stopped (SIGSTOP) or killed (SIGKILL, SIGTERM) ends in an
error or in the ranks' exit within seconds, and leaves no process and no heap file or folder of that run behind.

Leftovers are checked only by the pids a test recorded and by names carrying its own launcher's pid (spawn names
heap files tilec_<launcher pid>_..., folders tilec-<launcher pid>_...): never /dev/shm as a whole.
"""

import glob
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fault_workers
import pytest

from tilec.runtime import PeerLost, RankError, spawn
from tilec.runtime import liveness
from tilec.runtime.liveness import proc_state

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GRACE = 1.0  # seconds a stopped process may stay stopped (TILEC_STOP_GRACE) in these tests


def _run_files(launcher_pid: int) -> list[str]:
    """Heap files and spawn folders of the launcher with this pid."""
    return (glob.glob(f"/dev/shm/tilec_{launcher_pid}_*")
            + glob.glob(os.path.join(tempfile.gettempdir(), f"tilec-{launcher_pid}_*")))


def _gone(pid: int) -> bool:
    return proc_state(pid) in (None, "Z", "X")


def _wait_until(cond, seconds: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > seconds:
            pytest.fail(f"{what}: not within {seconds} s")
        time.sleep(0.05)
    return time.monotonic() - t0


def _pids(pid_dir: Path, n: int, seconds: float = 120) -> list[int]:
    """The pids the ranks recorded once their heaps were built (fault_workers._record_pid)."""
    _wait_until(lambda: len(list(pid_dir.glob("*.pid"))) == n, seconds, f"{n} ranks recording their pid")
    return [int((pid_dir / f"{r}.pid").read_text()) for r in range(n)]


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (read from /proc: the ranks of a launcher that has not recorded them)."""
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2:].split()[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def _assert_nothing_left(pids: list[int], launcher_pid: int, seconds: float) -> float:
    took = _wait_until(lambda: all(_gone(p) for p in pids), seconds, f"rank processes {pids} exiting")
    took += _wait_until(lambda: not _run_files(launcher_pid), 5, f"files of launcher {launcher_pid} removed")
    return took


@pytest.fixture
def short_grace(monkeypatch):
    """Stopped processes count as lost after GRACE s: in this launcher, and in the ranks (they read the env)."""
    monkeypatch.setenv("TILEC_STOP_GRACE", str(GRACE))
    monkeypatch.setattr(liveness, "STOP_GRACE_S", GRACE)


@pytest.fixture(autouse=True)
def no_leftovers():
    assert _run_files(os.getpid()) == []
    yield
    assert _run_files(os.getpid()) == []


class _Inject(threading.Thread):
    """Sends `sig` to rank `rank` once every rank is running (from a thread: spawn blocks the test's); `at` is when."""

    def __init__(self, pid_dir: Path, rank: int, sig: int):
        super().__init__(daemon=True)
        self.pid_dir, self.rank, self.sig, self.at = pid_dir, rank, sig, None
        self.start()

    def run(self):
        _wait_until(lambda: len(list(self.pid_dir.glob("*.pid"))) == 2, 120, "ranks recording their pids")
        time.sleep(0.3)  # the ranks are in their barrier loop
        os.kill(int((self.pid_dir / f"{self.rank}.pid").read_text()), self.sig)
        self.at = time.monotonic()

    def since(self) -> float:
        self.join()
        return time.monotonic() - self.at


# -- a rank stopped or killed ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGKILL])
def test_lost_rank_fails_the_launch_in_seconds(tmp_path, short_grace, sig):
    """Rank 1 is stopped or killed from outside while both ranks run barriers: the launch fails naming rank 1,
    in seconds, not at its 120 s timeout, and every rank process is reaped."""
    injector = _Inject(tmp_path, 1, sig)
    with pytest.raises(RankError) as ei:
        spawn(fault_workers.barriers, 2, heap_bytes=1 << 16, timeout=120, args=(str(tmp_path), 60.0))
    elapsed = injector.since()
    pids = [int((tmp_path / f"{r}.pid").read_text()) for r in range(2)]
    e, msg = ei.value, str(ei.value)
    if sig == signal.SIGKILL:
        # the launcher sees rank 1's death, or rank 0 reports its barrier broken by it first
        assert (e.rank == 1 and "killed by SIGKILL" in msg) or (e.rank == 0 and "rank 1 (pid" in msg), msg
    else:
        assert (e.rank == 1 and "is stopped" in msg) or (e.rank == 0 and "rank 1 (pid" in msg), msg
        assert "is stopped (SIGSTOP?)" in msg
    assert all(_gone(p) for p in pids)
    assert elapsed < GRACE + 5, f"took {elapsed:.1f} s after the signal"


def test_rank_names_a_stopped_peer_in_its_barrier(tmp_path, monkeypatch):
    """The ranks' own barrier (what a torchrun launch, with no tilec launcher watching, relies on) gives up on a
    stopped peer within seconds with PeerLost naming it. This launcher is made slow to notice the stop, so what
    fails the launch is rank 0's PeerLost."""
    monkeypatch.setenv("TILEC_STOP_GRACE", str(GRACE))
    monkeypatch.setattr(liveness, "STOP_GRACE_S", 600.0)
    injector = _Inject(tmp_path, 1, signal.SIGSTOP)
    with pytest.raises(RankError) as ei:
        spawn(fault_workers.barriers, 2, heap_bytes=1 << 16, timeout=120, args=(str(tmp_path), 60.0))
    elapsed = injector.since()
    pids = [int((tmp_path / f"{r}.pid").read_text()) for r in range(2)]
    e = ei.value
    assert e.rank == 0 and e.exc_type == "PeerLost", str(e)
    assert f"rank 0: barrier: rank 1 (pid {pids[1]}) is stopped (SIGSTOP?) for " in str(e)
    assert all(_gone(p) for p in pids)  # the stopped rank was killed too
    assert elapsed < GRACE + 5, f"took {elapsed:.1f} s after the signal"


def test_peer_lost_pickles():
    import pickle

    e = pickle.loads(pickle.dumps(PeerLost(0, 1, "rank 0: barrier: rank 1 (pid 5) died (its process is gone)")))
    assert (e.rank, e.peer, str(e)) == (0, 1, "rank 0: barrier: rank 1 (pid 5) died (its process is gone)")
