"""Probe: what the graph's separate epoch bump (EPOCH.add_(1) before the kernel, Program.capture) costs per replay.

Times CUDA graph replays (reading L2 flush before each, tilec.perf.gpu_time.cold_time) of [bump, kernel] against
[kernel] for a one-program kernel and flash decode's bare split stage
(decode_configs/decode_stream_probe.split_kernel) at B1 H128 S8K. Usage: python benchmarks/runs/epoch_probe.py
"""
import sys

import torch
import triton
import triton.language as tl

from tilec.perf.gpu_time import cold_time

sys.path.insert(0, "benchmarks/runs/decode_configs")
from decode_stream_probe import split_kernel  # noqa: E402


@triton.jit
def tiny(E, X):
    tl.store(X + tl.program_id(0), tl.load(E))


def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def main():
    e = torch.zeros(1, dtype=torch.int32, device="cuda")
    x = torch.zeros(264, dtype=torch.int32, device="cuda")
    b, hkv, g, d, s, bs = 1, 16, 8, 128, 8192, 512
    q = torch.randn(b, hkv * g, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    os_ = torch.empty(s // bs * b * hkv * g, d, device="cuda", dtype=torch.float32)
    ls = torch.empty(s // bs * b * hkv * g, device="cuda", dtype=torch.float32)
    kernels = {
        "tiny 1 program": lambda: tiny[(1,)](e, x),
        "tiny 264 programs": lambda: tiny[(264,)](e, x),
        "decode split B1 H128 S8K": lambda: split_kernel[(b * hkv * s // bs,)](q, k, v, os_, ls, s, s, s // bs, bs, 64,
                                                                                g, d, 0, 3, num_warps=4),
    }
    for name, kern in kernels.items():
        alone = graph_of(kern)
        bumped = graph_of(lambda kern=kern: (e.add_(1), kern()))
        t1 = cold_time(alone.replay, reps=100) * 1e6
        t2 = cold_time(bumped.replay, reps=100) * 1e6
        print(f"{name}: graph [kernel] {t1:.2f} us, [bump, kernel] {t2:.2f} us: the bump costs {t2 - t1:.2f} us",
              flush=True)


if __name__ == "__main__":
    main()
