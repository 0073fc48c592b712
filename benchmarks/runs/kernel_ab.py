"""A/B of the generated kernels' speed between two trees (before / after a change to the compiler), the same timing
in both: CUDA events around eager calls after an L2 flush that reads, median of 30 (world 1). Usage, once per tree:
PYTHONPATH=<tree> python benchmarks/runs/kernel_ab.py LABEL"""
import statistics
import sys

import torch

import tilec
from tilec.runtime import spawn

CASES = [("fused-pull", (8192, 28672, 8192)), ("specialized", (8192, 4608, 36864)), ("fused-push", (8192, 4608, 36864)),
         ("fused-push", (8192, 3584, 14336))]
CFG = dict(BM=128, BN=256, BK=64)


def inputs(prog, heap):
    try:
        from tilec.perf.inputs import bench_inputs
    except ImportError:
        from tilec.bench import _inputs as bench_inputs
    return bench_inputs(prog, heap, 0)


def rank(heap):
    flush = torch.empty(int(256e6) // 4, dtype=torch.float32, device="cuda")
    out = []
    for s, (m, n, k) in CASES:
        prog = tilec.compile("examples/ag_gemm.tile", world=1, schedule=s, dims={"M": m, "N": n, "K": k, **CFG},
                             retype={"f16": "bf16"}, num_warps=8, num_stages=3, group_m=8)
        mark = heap.mark()
        args = inputs(prog, heap)
        for _ in range(3):
            prog(heap, **args)
        ts = []
        for _ in range(30):
            flush.sum()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            prog(heap, entry_barrier=False, sync=False, **args)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        prog(heap, **args)
        heap.release(mark)
        out.append((s, m, n, k, statistics.median(ts), min(ts)))
    return out


if __name__ == "__main__":
    for s, m, n, k, med, lo in spawn(rank, 1, backend="iris", heap_bytes=3 << 30)[0]:
        print(f"{sys.argv[1]:4} {s:12} {m}x{n}x{k}: median {med:8.1f} us  min {lo:8.1f} us", flush=True)
