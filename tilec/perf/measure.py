"""How tilec times a call: CUDA events around the call only, a cross-rank barrier before each (outside the
timer), the median; tuned configs cached per device."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch


def tune_cache() -> Path:
    from tilec.program import cache_dir

    return cache_dir() / "tune.json"


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def median_time(fn, heap, iters: int, warmup: int) -> float:
    """Median of per-call times (seconds); a barrier before each call, outside the timed region."""
    for _ in range(warmup):
        heap.barrier()
        fn()
    times = []
    for _ in range(iters):
        heap.barrier()
        if heap.interpret:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        else:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def time_checked(prog, heap, args: dict, iters: int, warmup: int) -> float:
    """Median seconds of `prog` on `args` (tilec's timing discipline, median_time), bracketed by synchronous
    calls: the first compiles and fails fast on a wait that never completes (WaitTimeout), the last raises one
    that timed out during the unsynchronized timed calls instead of letting it go unseen."""
    prog(heap, **args)
    secs = median_time(lambda: prog(heap, entry_barrier=False, sync=False, **args), heap, iters, warmup)
    prog(heap, **args)
    return secs
