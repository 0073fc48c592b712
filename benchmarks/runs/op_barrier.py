"""What a tilec op call costs with host barriers, with device barrier kernels, and replayed from a CUDA
graph: a small All-Gather + GEMM (launch-bound) called back to back, timed with CUDA events after warmup.

    python benchmarks/runs/op_barrier.py [WORLD]      # spawned ranks on the visible GPU(s), default 1

Prints us per call for barrier="auto" (host barrier at entry and exit), barrier="device", and the device form
inside a CUDA graph (10 calls per graph), and checks each against torch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import tilec

ROOT = Path(__file__).resolve().parents[2]


def _per_call(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    tilec.runtime.active_heap().barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def rank(heap, m: int, n: int, k: int, iters: int) -> dict:
    w, r, dev = heap.world, heap.rank, heap.device
    a = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    b = torch.randn(k, n, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).to(dev)
    mine = tilec.empty((m // w, k), torch.bfloat16)
    mine.copy_(a.chunk(w)[r])
    want = (a.float() @ b.float().cpu())
    out = {}
    for barrier in ("auto", "device"):
        op = tilec.op(ROOT / "examples" / "ag_gemm.tile", name=f"bar_{barrier}", retype={"f16": "bf16"},
                      barrier=barrier)
        err = float((op(mine, b).float().cpu() - want).abs().max() / want.abs().max())
        out[barrier] = (_per_call(lambda op=op: op(mine, b), iters), err)
        if barrier == "device":
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ys = [op(mine, b) for _ in range(10)]
            out["graph"] = (_per_call(g.replay, max(1, iters // 10)) / 10,
                            float((ys[-1].float().cpu() - want).abs().max() / want.abs().max()))
    return out


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    res = tilec.runtime.spawn(rank, world, backend="iris", heap_bytes=1 << 26, args=(512, 256, 256, 200))
    for name in ("auto", "device", "graph"):
        us, err = res[0][name]
        print(f"world {world} barrier {name:>6}: {us:8.1f} us/call   rel err {err:.2e}")
