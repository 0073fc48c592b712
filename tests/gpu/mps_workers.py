"""Rank-side code of the residency test (importable by spawned rank processes): is every program of a persistent
grid sized by tilec's launch path resident at once, on every rank sharing the GPU?"""

from __future__ import annotations

import iris
import torch
import triton
import triton.language as tl

import tilec.device as td
from tilec.runtime.launch import LaunchContext, mps_client


@triton.jit
def _all_resident(bar, smid, err, heap_bases, rank, timeout_ns, target):
    # every program of every rank arrives on rank 0's counter, then spins (bounded) until all have: it passes only
    # if all of them are resident together
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(smid + tl.program_id(0), sm)
    tl.debug_barrier()
    iris.atomic_add(bar, 1, rank, 0, heap_bases, sem="release", scope="sys")
    td.wait(bar, target, rank, 0, heap_bases, err, timeout_ns, 0, 0, "sys", False)


def resident(heap, num_warps: int = 32, timeout_s: float = 10.0) -> dict:
    """Launches a grid as tilec sizes a persistent kernel of this one's resources (LaunchContext.fit/.grid: programs
    per SM by registers, shared memory and threads, times the SMs this rank has). 32 warps make 2 programs fill an
    SM's 2048 threads, so a peer's program on the same SM could not be resident beside them."""
    ctx = LaunchContext(heap, int(timeout_s * 1e9))
    bar = heap.alloc((1,), torch.int32)
    err = torch.zeros(8, dtype=torch.int32, device=heap.device)
    probe = torch.zeros(1, dtype=torch.int32, device=heap.device)
    args = (bar, probe, err, heap.heap_bases(), heap.rank, ctx.timeout_ns, 1 << 30)
    compiled = _all_resident.warmup(*args, grid=(1,), num_warps=num_warps)
    ctx.fit("probe", compiled, num_warps)
    nprog = ctx.grid(1 << 30, True, 1.0, 0, "probe")
    smid = torch.full((nprog,), -1, dtype=torch.int32, device=heap.device)
    total = torch.tensor([nprog], dtype=torch.int64)
    torch.distributed.all_reduce(total)  # the gloo group: every rank's grid, so the target counts all programs
    heap.barrier()
    _all_resident[(nprog,)](bar, smid, err, heap.heap_bases(), heap.rank, ctx.timeout_ns, int(total.item()),
                            num_warps=num_warps)
    torch.cuda.synchronize()
    heap.barrier()
    return {"claim": ctx.claim, "sms": ctx.capacity, "per_sm": ctx.per_sm[("probe", False)], "nprog": nprog,
            "total": int(total.item()),
            "timed_out": int(err[0].item()), "smids": sorted(set(smid.tolist())), "mps": mps_client()}
