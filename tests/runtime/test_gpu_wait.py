"""The host's wait for a call's kernels is bounded (runtime/gpu_wait.py): kernels stuck outside tilec's flag waits
(each of which stops after wait_timeout) fail the call with KernelsStuck instead of hanging the rank. The GPU is
stood in for by an event whose work finishes after a number of polls, or never."""

import pickle
import time

import pytest
import torch

import tilec
from tilec.runtime import KernelsStuck, gpu_wait


class _Event:
    """torch.cuda.Event of queued work that is done after `polls` queries (None: never)."""

    polls: int | None = 0

    def __init__(self):
        self.left = _Event.polls

    def record(self, stream):
        self.stream = stream

    def query(self):
        if self.left is None:
            return False
        self.left -= 1
        return self.left < 0


@pytest.fixture
def fake_gpu(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    return synced


@pytest.mark.parametrize("polls", [0, 3, 2000])
def test_finished_work_returns_and_synchronizes(fake_gpu, polls):
    _Event.polls = polls
    assert gpu_wait.finish_queued("cuda:0", 5.0) is True
    assert fake_gpu == ["cuda:0"]  # the rest of the device's queued work, once the call's own is done


def test_stuck_work_gives_up_at_the_limit(fake_gpu):
    _Event.polls = None
    t0 = time.monotonic()
    assert gpu_wait.finish_queued("cuda:0", 0.2) is False
    assert 0.2 <= time.monotonic() - t0 < 2.0
    assert fake_gpu == []  # a synchronize would hang on it


def test_limit_covers_one_wait_timeout_per_kernel():
    assert gpu_wait.stuck_after(30.0, 2) == 3 * 30.0 + gpu_wait.SLACK_S
    assert gpu_wait.stuck_after(2.0, 1) > 2.0 * 1


class _GpuHeap:
    """What _wait_and_check reads of a heap on a GPU."""

    interpret = False
    device = "cuda:0"
    rank = 3


def test_a_call_whose_kernels_never_finish_raises_kernels_stuck(fake_gpu, monkeypatch):
    monkeypatch.setattr(gpu_wait, "SLACK_S", 0.1)
    prog = tilec.compile("examples/ag_gemm.tile", world=2, schedule="flags", backend="nvshmem", ranks_per_node=1,
                         wait_timeout=0.05)
    st = {"bufs": {"ERR": torch.zeros(8, dtype=torch.int32)}}
    _Event.polls = None
    t0 = time.monotonic()
    with pytest.raises(KernelsStuck) as ei:
        prog._wait_and_check(_GpuHeap(), st)
    limit = gpu_wait.stuck_after(0.05, prog.kernel_count)
    assert limit <= time.monotonic() - t0 < limit + 2.0
    msg = str(ei.value)
    assert msg.startswith(f"rank 3: the kernels of ag_gemm (flags) had not finished {limit:g} s after"), msg
    assert "wait_timeout=0.05 s" in msg and "NVSHMEM" in msg and "\n" not in msg
    assert ei.value.rank == 3
    again = pickle.loads(pickle.dumps(ei.value))  # it crosses from a rank process to the launcher
    assert (type(again), str(again), again.rank, again.seconds) == (KernelsStuck, msg, 3, limit)
    _Event.polls = 1  # the same call finishing: no error, and the error record is read as before
    prog._wait_and_check(_GpuHeap(), st)


def test_a_heap_barrier_does_not_wait_forever_on_stuck_kernels(fake_gpu):
    """A barrier first waits for the rank's queued GPU work (calls made with sync=False leave it queued): for at
    most the barrier's own limit, then KernelsStuck naming the rank."""
    from types import SimpleNamespace

    from tilec.runtime.heap import Heap

    heap = SimpleNamespace(device="cuda:0", timeout=0.2, rank=1)
    _Event.polls = None
    t0 = time.monotonic()
    with pytest.raises(KernelsStuck, match=r"^rank 1: the GPU work queued before a heap barrier had not finished "
                                           r"after 0\.2 s \(the barrier's limit\)"):
        Heap.finish_gpu_work(heap)
    assert 0.2 <= time.monotonic() - t0 < 2.0
    _Event.polls = 2
    Heap.finish_gpu_work(heap)  # finished work: returns
    assert fake_gpu == ["cuda:0"]


def test_closing_a_heap_does_not_hang_on_stuck_kernels(fake_gpu, monkeypatch):
    """Closing waits for the rank's GPU work at most CLOSE_WAIT_S; stuck kernels leave the memory to the process's
    exit (a rank that reported KernelsStuck still exits)."""
    from types import SimpleNamespace

    from tilec.runtime import heap as heap_mod

    monkeypatch.setattr(heap_mod, "CLOSE_WAIT_S", 0.2)
    h = SimpleNamespace(device="cuda:0")
    _Event.polls = None
    t0 = time.monotonic()
    assert heap_mod.Heap.gpu_work_settled(h) is False
    assert time.monotonic() - t0 < 2.0
    _Event.polls = 0
    assert heap_mod.Heap.gpu_work_settled(h) is True
