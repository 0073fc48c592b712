"""spawn() on the CPU backend: real Iris device calls across rank processes, errors, timeouts, cleanup."""

import glob
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import rank_workers
import torch

from tilec.runtime import LaunchTimeout, RankError, TilecRuntimeError, spawn
from tilec.runtime import launcher as launcher_mod


def _leftovers():
    return glob.glob(f"/dev/shm/tilec_{os.getpid()}_*")


@pytest.fixture(autouse=True)
def no_leftover_shm():
    assert _leftovers() == []
    yield
    assert _leftovers() == []


@pytest.mark.parametrize("world", [2, pytest.param(3, marks=pytest.mark.slow)])  # world 3: full run only
def test_ring_kernel_matches_torch(world):
    tiles = 3
    n = tiles * rank_workers.BLOCK
    res = spawn("rank_kernels:ring", world, heap_bytes=1 << 16, timeout=120, kwargs={"tiles": tiles})
    assert len(res) == world
    for r, got in enumerate(res):
        src, peer = (r - 1) % world, (r + 1) % world
        torch.testing.assert_close(got["out"], rank_workers.rank_data(src, n) * 2 + src, rtol=0, atol=0)
        torch.testing.assert_close(got["pulled"], rank_workers.rank_data(peer, n), rtol=0, atol=0)
        assert got["flags"].tolist() == [1] * tiles
        assert got["offsets"] == res[0]["offsets"]
        assert got["interpret"] is True
    assert "rank_kernels" not in sys.modules  # "module:function" is imported by the ranks only


def test_symmetric_layout_owns_and_exhaustion():
    world = 3
    res = spawn(rank_workers.alloc_layout, world, heap_bytes=1 << 14, timeout=60)
    offsets = res[0]["offsets"]
    assert all(x["offsets"] == offsets for x in res)
    assert offsets == sorted(offsets) and all(o % 256 == 0 for o in offsets)
    for r, x in enumerate(res):
        assert x["owned"] and not x["foreign"] and x["active"]
        assert x["peer_a"].eq((r + 1) % world + 1).all()  # peer's fill, read through its mapped heap
        assert x["capacity"] == 1 << 14
        assert "heap exhausted" in x["exhausted"] and f"{x['used']} of {1 << 14} B" in x["exhausted"]


def test_rank_exception_becomes_rank_error():
    t0 = time.monotonic()
    with pytest.raises(RankError) as ei:
        spawn(rank_workers.fail_on, 2, timeout=60, args=(1,))
    err = ei.value
    assert str(err) == "rank 1: ValueError: boom on purpose"
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "Traceback" in err.details and "fail_on" in err.details
    assert time.monotonic() - t0 < 30  # rank 0, stuck in a barrier, was terminated


def test_rank_crash_becomes_rank_error():
    with pytest.raises(RankError, match=r"^rank 0: was killed by SIGKILL before reporting") as ei:
        spawn(rank_workers.crash_on, 2, timeout=60, args=(0,))
    assert ei.value.exitcode == -9


def test_hang_raises_launch_timeout_in_time(capfd):
    timeout = 5.0
    t0 = time.monotonic()
    with pytest.raises(LaunchTimeout) as ei:
        spawn(rank_workers.hang_on, 2, timeout=timeout, args=(1,))
    elapsed = time.monotonic() - t0
    assert 1 in ei.value.ranks  # rank 0 may be listed too on a badly overloaded machine
    assert "ranks still running: " in str(ei.value)
    assert timeout <= elapsed < timeout + 7
    err = capfd.readouterr().err  # the hung rank's stack, written before it was killed: where it hung
    assert re.search(r'File ".*rank_workers\.py", line \d+ in hang_on', err), err[-2000:]


def test_keyboard_interrupt_terminates_ranks(monkeypatch, tmp_path):
    """Ctrl-C in the launcher: ranks are killed, heap files removed, the interrupt propagates."""
    real_wait = launcher_mod._wait

    def interrupted_wait(objs, timeout=None):
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("*.pid"))) < 2 and time.monotonic() < deadline:
            real_wait(objs, timeout=0.1)
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher_mod, "_wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        spawn(rank_workers.write_pid_and_wait, 2, timeout=60, args=(str(tmp_path),))
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_env_restored_and_big_args(start_method, monkeypatch):
    """The ranks see the launcher's environment as it is at this launch (forked ones too: their server started
    earlier, with another), and big arguments."""
    before = os.environ.get("TRITON_INTERPRET")
    mark = f"set-at-{time.monotonic()}"
    monkeypatch.setenv("TILEC_TEST_LAUNCH_MARK", mark)
    blob = bytes(range(256)) * 4096  # 1 MiB: more than a pipe holds, must not serialize or block rank start
    res = spawn(rank_workers.rank_and_world, 2, timeout=60, args=(blob, "TILEC_TEST_LAUNCH_MARK"),
                start_method=start_method)
    assert res == [(0, 2, "cpu", "1", len(blob), mark), (1, 2, "cpu", "1", len(blob), mark)]
    assert os.environ.get("TRITON_INTERPRET") == before


def test_bad_fn_is_rejected_in_parent():
    with pytest.raises(TilecRuntimeError, match="module-level function"):
        spawn(lambda heap: 0, 2)
    with pytest.raises(ValueError, match="module:function"):
        spawn("rank_kernels.ring", 2)
    with pytest.raises(ValueError, match=r"start_method 'fork': expected one of \('spawn', 'forkserver'\)"):
        spawn(rank_workers.rank_and_world, 1, start_method="fork")


def test_script_without_main_guard_fails_fast(tmp_path):
    """Spawned ranks re-import the main script; an unguarded spawn() there must fail, not recurse or hang."""
    here = Path(__file__).resolve().parent
    script = tmp_path / "unguarded.py"
    script.write_text(
        f"import sys\nsys.path[:0] = [{str(here.parents[1])!r}, {str(here)!r}]\n"
        "import rank_workers\nfrom tilec.runtime import spawn\n"
        "print(spawn(rank_workers.rank_and_world, 2, timeout=60))\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "if __name__ == '__main__':" in err
    assert "RankError: rank " in err and "exited with code 1 before reporting" in err
    assert glob.glob(f"/dev/shm/tilec_{proc.pid}_*") == []
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"tilec-{proc.pid}_*")) == []
