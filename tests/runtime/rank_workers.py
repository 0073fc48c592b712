"""Rank functions without kernels (torch only, so their ranks start fast)."""

import os
import signal
import time

import torch

from tilec.runtime import HeapError, active_heap

BLOCK = 16  # elements per tile of rank_kernels.ring


def rank_data(rank: int, n: int) -> torch.Tensor:
    """What rank `rank` puts in its `data` buffer in rank_kernels.ring."""
    return torch.arange(n, dtype=torch.float32) * (rank + 1) + 0.25


def alloc_layout(heap):
    """Allocations of mixed sizes and dtypes; offsets, ownership, peer views and exhaustion."""
    a = heap.alloc((3, 5), torch.float16)
    b = heap.alloc(7, torch.int8, zero=False)
    c = heap.alloc((), torch.float64)
    d = heap.alloc((0, 4), torch.float32)
    e = heap.alloc([2, 3, 4], torch.bfloat16)
    ts = (a, b, c, d, e)
    a.fill_(heap.rank + 1)
    heap.barrier()
    peer = (heap.rank + 1) % heap.world
    seen = heap.peer_view(a, peer).clone() if heap.backend == "cpu" else None  # GPU heaps have no host peer view
    heap.barrier()
    try:
        heap.alloc(heap.capacity, torch.uint8)
        exhausted = None
    except HeapError as err:
        exhausted = str(err)
    return {
        "offsets": [heap.offset_of(t) for t in ts],
        "owned": all(heap.owns(t) for t in ts) and heap.owns(e[1]),
        "foreign": heap.owns(torch.zeros(4)),
        "active": active_heap() is heap,
        "peer_a": seen,
        "used": heap.used,
        "capacity": heap.capacity,
        "exhausted": exhausted,
    }


def fail_on(heap, bad_rank: int):
    """`bad_rank` raises; the others wait in a barrier that can never complete."""
    if heap.rank == bad_rank:
        raise ValueError(f"boom on purpose\nsecond line from rank {heap.rank}")
    heap.barrier()
    return heap.rank


def crash_on(heap, bad_rank: int):
    if heap.rank == bad_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    heap.barrier()
    return heap.rank


def hang_on(heap, bad_rank: int):
    if heap.rank == bad_rank:
        time.sleep(3600)
    return heap.rank


def write_pid_and_wait(heap, pid_dir: str):
    with open(os.path.join(pid_dir, f"{heap.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(3600)


def rank_and_world(heap, blob=b"", var=None):
    out = heap.rank, heap.world, heap.backend, os.environ.get("TRITON_INTERPRET"), len(blob)
    return out if var is None else (*out, os.environ.get(var))


def peer_view_probe(heap):
    return heap.peer_view(heap.alloc(4, torch.float32), 0)
