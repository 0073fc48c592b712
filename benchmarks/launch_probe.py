"""Probe: how much of a short call is the host's launch path (Python between the timer's start event and the
kernel's launch), for the persistent flash decode (fused-push) and All-Gather + GEMM (fused-pull), world 1.

Per program: the CUDA-event time of a call (tilec.perf.bench's discipline), the host time of the call alone, and the
host time's top functions (cProfile over 200 calls). Run on the device: python benchmarks/launch_probe.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

import tilec
from tilec.perf.bench import _inputs
from tilec.runtime import spawn


def _probe_one(heap, prog, label):
    args = _inputs(prog, heap, 0)
    prog(heap, **args)
    ev, host = [], []
    for _ in range(30):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        t0 = time.perf_counter()
        prog(heap, entry_barrier=False, sync=False, **args)
        t1 = time.perf_counter()
        e.record()
        e.synchronize()
        ev.append(s.elapsed_time(e) * 1e3)
        host.append((t1 - t0) * 1e6)
    print(f"{label}: call {statistics.median(ev):.1f} us (events), host launch path {statistics.median(host):.1f} us",
          flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        prog(heap, entry_barrier=False, sync=False, **args)
        torch.cuda.synchronize()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
    print("\n".join(ln for ln in out.getvalue().splitlines() if ln.strip())[:3000], flush=True)


def probe(heap):
    dec = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", retype={"f16": "bf16"},
                        dims=dict(B=1, HKV=16, G=8, D=128, S=32768, BS=1024))
    _probe_one(heap, dec, "flash decode S=32K fused-push")
    ag = tilec.compile("examples/ag_gemm.tile", world=1, schedule="fused-pull", retype={"f16": "bf16"},
                       dims=dict(M=1024, N=3584, K=8192, BM=128, BN=256, BK=64), num_warps=8)
    _probe_one(heap, ag, "ag_gemm 1024x3584x8192 fused-pull")


if __name__ == "__main__":
    spawn("benchmarks.launch_probe:probe", 1, backend="iris", heap_bytes=1 << 30, timeout=600)
    sys.exit(0)
