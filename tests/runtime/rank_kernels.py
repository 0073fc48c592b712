"""Kernels and rank functions run by spawned rank processes (so they must be importable by name).

Imports triton: the launcher sets TRITON_INTERPRET=1 for cpu ranks before this module is loaded.
"""

import iris
import torch
import triton
import triton.language as tl
from rank_workers import BLOCK, rank_data


@triton.jit
def ring_kernel(data, flags, out, pulled, heap_bases, rank: tl.constexpr, world: tl.constexpr, BLOCK: tl.constexpr):
    """Tile pid: push 2*data+rank to the next rank's `out`, signal it, wait for the previous rank's
    signal, then pull the next rank's `data` tile."""
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    peer = (rank + 1) % world
    vals = tl.load(data + offs) * 2 + rank
    iris.store(out + offs, vals, rank, peer, heap_bases)
    iris.atomic_add(flags + pid, 1, rank, peer, heap_bases, sem="release", scope="sys")
    while tl.atomic_cas(flags + pid, 1, 1, sem="acquire", scope="sys") != 1:
        pass
    got = iris.load(data + offs, rank, peer, heap_bases)
    tl.store(pulled + offs, got)


def ring(heap, tiles: int = 3):
    n = tiles * BLOCK
    data = heap.alloc(n, torch.float32)
    flags = heap.alloc(tiles, torch.int32)
    out = heap.alloc(n, torch.float32)
    pulled = heap.alloc(n, torch.float32)
    data.copy_(rank_data(heap.rank, n).to(heap.device))
    heap.barrier()  # peers' data is in place before anyone pulls it
    ring_kernel[(tiles,)](data, flags, out, pulled, heap.heap_bases(), heap.rank, heap.world, BLOCK)
    heap.barrier()
    return {
        "out": out,
        "pulled": pulled,
        "flags": flags,
        "offsets": [heap.offset_of(t) for t in (data, flags, out, pulled)],
        "interpret": heap.interpret,
    }
