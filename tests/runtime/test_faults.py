"""Faults on the CPU emulation: a rank or the launcher stopped (SIGSTOP) or killed (SIGKILL, SIGTERM) ends in an
error or in the ranks' exit within seconds, and leaves no process and no heap file or folder of that run behind.

Leftovers are checked only by the pids a test recorded and by names carrying its own launcher's pid (spawn names
heap files tilec_<launcher pid>_..., folders tilec-<launcher pid>_...): never /dev/shm as a whole.
"""

import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fault_workers
import pytest

from tilec.ir.graph import state_of
from tilec.program import WaitTimeout
from tilec.runtime import PeerLost, RankError, liveness, spawn
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


@pytest.mark.gpu
def test_iris_barrier_names_a_stopped_peer(tmp_path, monkeypatch):
    """The same on Iris heaps (two ranks sharing a GPU): IrisHeap.barrier is bounded like ShmHeap's, where Iris's
    own (dist.barrier) would wait forever on a stopped peer."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setenv("TILEC_STOP_GRACE", str(GRACE))
    monkeypatch.setattr(liveness, "STOP_GRACE_S", 600.0)
    injector = _Inject(tmp_path, 1, signal.SIGSTOP)
    with pytest.raises(RankError) as ei:
        spawn(fault_workers.barriers, 2, backend="iris", heap_bytes=1 << 22, timeout=180, args=(str(tmp_path), 90.0))
    elapsed = injector.since()
    pids = [int((tmp_path / f"{r}.pid").read_text()) for r in range(2)]
    e = ei.value
    assert e.rank == 0 and e.exc_type == "PeerLost", str(e)
    assert f"rank 0: barrier: rank 1 (pid {pids[1]}) is stopped (SIGSTOP?) for " in str(e)
    assert elapsed < GRACE + 10, f"took {elapsed:.1f} s after the signal"


# -- the launcher killed or stopped --------------------------------------------------------------------------------


def _launcher(tmp_path: Path, seconds: float = 60.0) -> subprocess.Popen:
    """A launcher of 2 ranks running barriers, in a process of its own (the test kills it)."""
    script = tmp_path / "launch.py"
    script.write_text(
        f"import sys\nsys.path[:0] = [{str(ROOT)!r}, {str(HERE)!r}]\n"
        "import fault_workers\nfrom tilec.runtime import spawn\n"
        "if __name__ == '__main__':\n"
        f"    print(spawn(fault_workers.barriers, 2, heap_bytes=1 << 16, timeout=120, args=({str(tmp_path)!r},"
        f" {seconds})))\n")
    env = dict(os.environ, TILEC_STOP_GRACE=str(GRACE))
    return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_launcher_killed_during_startup(tmp_path):
    """SIGKILL of the launcher once its ranks exist but before their heaps are built (its heap files are still in
    /dev/shm): the ranks remove the run's files and exit as soon as they are up."""
    proc = _launcher(tmp_path)
    try:
        _wait_until(lambda: len(_children(proc.pid)) >= 2 and glob.glob(f"/dev/shm/tilec_{proc.pid}_*"), 120,
                    "the launcher starting its ranks")
        ranks = _children(proc.pid)
        assert not list(tmp_path.glob("*.pid"))  # still starting up
        proc.kill()
        proc.wait()
        # the ranks may still be importing torch on a loaded machine; one that had not yet read its start-up data
        # from the dead launcher exits before it can clean up: then the next start removes the dead owner's files
        _wait_until(lambda: all(_gone(p) for p in ranks), 90, f"rank processes {ranks} exiting")
        if _run_files(proc.pid):
            from tilec.runtime.cpu_heap import remove_stale
            from tilec.runtime.launcher import _remove_stale_tmpdirs

            remove_stale()
            _remove_stale_tmpdirs()
        assert not _run_files(proc.pid)
        assert not list(tmp_path.glob("*.pid"))
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_launcher_killed_during_run(tmp_path, sig):
    """SIGKILL of the launcher while its ranks run: they notice within a poll and exit, removing the run's folder
    (their heap files were unlinked once every rank had mapped them). SIGTERM: the launcher itself kills and reaps
    them and removes its files, then exits 128+15. Before that, its start removed heap files of a launcher that
    died earlier (and nothing else)."""
    dead = _dead_pid()
    stale = Path(f"/dev/shm/tilec_{dead}_0123abcd_r0")
    kept = [Path(f"/dev/shm/tilec_{dead}_0123abcd_x0"), Path(f"/dev/shm/tilec_{dead}_0123abcd_r0.bak")]
    for f in [stale, *kept]:
        f.write_bytes(b"")
    proc = _launcher(tmp_path)
    try:
        ranks = _pids(tmp_path, 2)
        assert not stale.exists() and all(f.exists() for f in kept)
        os.kill(proc.pid, sig)
        took = _assert_nothing_left(ranks, proc.pid, 10)
        assert took < 5, f"ranks took {took:.1f} s to go"
        assert proc.wait(10) == (-9 if sig == signal.SIGKILL else 128 + signal.SIGTERM)
    finally:
        proc.kill()
        proc.communicate()
        for f in [stale, *kept]:
            f.unlink(missing_ok=True)


@pytest.mark.slow
def test_launcher_cleanup_outlasts_a_second_sigterm(tmp_path):
    """`timeout CMD` signals its whole process group and a wrapper script forwards the same signal, so a launcher
    often gets SIGTERM twice: the second must not cut short what the first started. The launcher still prints every
    rank's stack, kills and reaps the ranks, removes its files and exits 128+15."""
    proc = _launcher(tmp_path)
    try:
        ranks = _pids(tmp_path, 2)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.05)  # inside the cleanup: the stacks are collected over a few tenths of a second
        os.kill(proc.pid, signal.SIGTERM)
        _assert_nothing_left(ranks, proc.pid, 10)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
        for r in range(2):
            assert f"tilec: rank {r} (pid {ranks[r]}) was here when the launcher gave up on it" in err, err[-2000:]
        assert re.search(r'File ".*fault_workers\.py", line \d+ in barriers', err), err[-2000:]
    finally:
        proc.kill()
        proc.communicate()


def test_launcher_stopped_during_run(tmp_path):
    """SIGSTOP of the launcher while its ranks run: they give up after TILEC_STOP_GRACE seconds and exit; continued,
    the launcher reports that they did."""
    proc = _launcher(tmp_path)
    try:
        ranks = _pids(tmp_path, 2)
        os.kill(proc.pid, signal.SIGSTOP)
        took = _wait_until(lambda: all(_gone(p) for p in ranks), 10 * GRACE + 10, "ranks giving up")
        assert took >= GRACE * 0.9  # the launcher was not taken for lost before the grace
        os.kill(proc.pid, signal.SIGCONT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        # whichever rank's report the launcher reads first: one that gave up on it, or one whose peer already had
        assert "RankError: rank " in err and (f"gave up on its launcher (stopped for over {GRACE:g} s" in err
                                              or ("PeerLost" in err and "died" in err)), err
        assert not _run_files(proc.pid)
    finally:
        proc.kill()
        proc.communicate()


def test_peer_lost_pickles():
    import pickle

    e = pickle.loads(pickle.dumps(PeerLost(0, 1, "rank 0: barrier: rank 1 (pid 5) died (its process is gone)")))
    assert (e.rank, e.peer, str(e)) == (0, 1, "rank 0: barrier: rank 1 (pid 5) died (its process is gone)")


# -- what a flag wait that timed out says -----------------------------------------------------------------------


class _Heap:
    """What _check_timeout reads of a heap: the rank."""

    def __init__(self, rank):
        self.rank = rank


def _timed_out(prog, rank, flag_no, counter, owner, seen, target):
    """Run the host side of a kernel's timed-out wait: ERR as _tilec_timed_out leaves it."""
    import torch

    err = torch.tensor([1, flag_no, counter, owner, seen, target, 0, 0], dtype=torch.int32)
    with pytest.raises(WaitTimeout) as ei:
        prog._check_timeout(_Heap(rank), {"bufs": {"ERR": err}})
    assert err.tolist()[0] == 0  # reported once
    return ei.value


def test_wait_timeout_names_rank_flag_tile_and_releasing_stage():
    """ag_gemm at world 2 (M=128, BM=64): counter 1 of Ag's flag guards rows 64:128 of Ag, which `gather` writes
    at r=1 (rank 1's A); the message names the waiting rank, the flag, that tile, the owner, what was seen of which
    target, and where the stage that should have released it is in the .tile file."""
    import tilec

    path = ROOT / "examples" / "ag_gemm.tile"
    prog = tilec.compile(str(path), world=2, schedule="flags", dims={"M": 128, "N": 64, "K": 64})
    lines = path.read_text().splitlines()
    line = next(i for i, t in enumerate(lines, 1) if t.strip().startswith("stage gather "))
    col = lines[line - 1].index("gather") + 1
    # K=64 by BK=32: both k tiles of a row block release its one counter, so call 2 waits for 4
    e = _timed_out(prog, rank=0, flag_no=1, counter=1, owner=0, seen=2, target=4)
    msg = str(e)
    assert msg.startswith("rank 0 waited on flag Ag.gather[1] (tile Ag[64:128, :] where r=1, m=0) on rank 0 for ~")
    assert "it reached 2 of 4; stage gather on the producing rank never released it (call 2, 2 releases a call;" in msg
    assert f"; stage gather is at {path.relative_to(ROOT)}:{line}:{col};" in msg or \
        f"; stage gather is at {path}:{line}:{col};" in msg, msg
    assert (e.rank, e.flag, e.tensor, e.counter, e.tile, e.owner, e.seen, e.target, e.stage) == \
        (0, "Ag.gather", "Ag", 1, "64:128, :", 0, 2, 4, "gather")
    assert "\n" not in msg
    import pickle

    assert str(pickle.loads(pickle.dumps(e))) == msg


@pytest.mark.parametrize("example", ["ag_gemm", "gemm_rs", "flash_decode"])
def test_wait_timeout_tiles_partition_what_producers_write(example):
    """For every flag of every schedule of the example (world 2), the tiles that WaitTimeout names for its counters
    cover each producer task's write (its index evaluated at the task's loop values, a tile wide along tile loops)
    exactly once, at the counter that task releases, and name that task's keyed loop values."""
    import itertools

    import tilec
    from tilec.ir.graph import flags, stage

    checked = 0
    for sched in ("flags", "fused-push", "specialized"):
        try:
            prog = tilec.compile(str(ROOT / "examples" / f"{example}.tile"), world=2, schedule=sched)
        except tilec.errors.TilecError:
            continue  # not a schedule of this example
        # fold-last's arrival counters are bumped, never waited on: no WaitTimeout names them
        arrivals = {fo.flag for fo in state_of(prog.graph).folds}
        for no, f in enumerate(flags(prog.graph), 1):
            if f.name in arrivals:
                continue
            spans = []
            for c in range(f.size):
                e = _timed_out(prog, 0, no, c, 0, 0, 1)
                spans.append((_boxes(e.tile), dict(kv.split("=") for kv in _where(str(e)))))
            st = stage(prog.graph, f.producer)
            loops = {v.name: v for v in st.loops}
            names = [*loops, "rank"]  # `rank`, the executing rank, may index a push's destination
            ranges = [range(2) if v.is_rank else range(0, v.extent, v.step) for v in st.loops] + [range(2)]
            checked += 1
            for vals in itertools.product(*ranges):
                env = dict(zip(names, vals, strict=True))
                box = []
                for aff in f.write.index:
                    lo = aff.const + sum(k * env[v] for v, k in aff.terms)
                    tile = [loops[v] for v, _k in aff.terms if v in loops and not loops[v].is_rank
                            and loops[v].step > 1]
                    width = min(tile[0].step, tile[0].extent - env[tile[0].name]) if tile else 1
                    box.append((lo, lo + width))
                hits = [c for c, (b, _w) in enumerate(spans) if all(_inside(x, y) for x, y in zip(box, b, strict=True))]
                assert hits == [_counter_of(f, loops, env)], (sched, f.name, env, box, spans)
                where = spans[hits[0]][1]
                assert all(int(v) == env[k] for k, v in where.items()), (sched, f.name, env, where)
    assert checked >= 2


def _counter_of(f, loops: dict, env: dict) -> int:
    """The counter a producer task releases, from the layout FLAGS documents: row-major over the written dims; along
    a dim, (outer value) * (tile trips) + tile number, each part only when its loop is in the flag's key (an outer
    loop: a rank loop, `rank`, or a loop of step 1, with its number of values; a tile loop: steps of more than 1)."""
    counter = 0
    for aff in f.write.index:
        outer = [v for v, _k in aff.terms if v == "rank" or loops[v].is_rank
                 or (loops[v].step == 1 and loops[v].extent > 1)]
        tile = [v for v, _k in aff.terms if v != "rank" and not loops[v].is_rank and loops[v].step > 1]
        coord, size = 0, 1
        if outer and outer[0] in f.key:
            n = 2 if outer[0] == "rank" or loops[outer[0]].is_rank else loops[outer[0]].extent
            coord, size = env[outer[0]], n
        if tile and tile[0] in f.key:
            trips = -(-loops[tile[0]].extent // loops[tile[0]].step)
            coord, size = coord * trips + env[tile[0]] // loops[tile[0]].step, size * trips
        counter = counter * size + coord
    return counter


def _boxes(tile: str):
    """'64:128, :, 3' -> [(64, 128), None, (3, 4)] (None: the whole dim)."""
    out = []
    for part in tile.split(", "):
        if part == ":":
            out.append(None)
        elif ":" in part:
            lo, hi = part.split(":")
            out.append((int(lo), int(hi)))
        else:
            out.append((int(part), int(part) + 1))
    return out


def _where(msg: str) -> list[str]:
    head = msg.split(") on rank ")[0]
    return head.split(" where ")[1].split(", ") if " where " in head else []


def _inside(box, span) -> bool:
    return span is None or (span[0] <= box[0] and box[1] <= span[1])
