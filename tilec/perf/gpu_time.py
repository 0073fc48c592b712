"""Kernel times with a cold, clean L2 (GPU only).

triton.testing.do_bench flushes L2 between launches by *zeroing* a 256 MB buffer. That leaves L2 full of dirty
lines, and the timed kernel's first reads evict them: it pays the write-back of up to an L2 of the flush's data.
A memory-bound kernel of tens of microseconds cannot hide that (benchmarks/runs/flush_probe.py on an H200, 60 MB L2:
bsp's decode local phase at 96 heads, 32K keys, 66.1 us after a zeroing flush, 58.0 us after a reading one; a
copy of 100 MB 51.4 vs 48.8 us). cold_time flushes by *reading* a buffer of several L2s instead, so the kernel
starts with nothing of its own in L2 and nothing dirty to write back.
"""

from __future__ import annotations

import statistics

_FLUSH: dict = {}  # device index -> the flush buffer (allocated once)


def _flush_buffer(torch):
    dev = torch.cuda.current_device()
    if dev not in _FLUSH:
        l2 = torch.cuda.get_device_properties(dev).L2_cache_size
        # zeroed once here (its dirty lines written back long before any timing); f32 so that the sum streams
        _FLUSH[dev] = torch.zeros(max(256 << 20, 4 * l2) // 4, dtype=torch.float32, device="cuda")
    return _FLUSH[dev]


def flush_l2() -> None:
    """Evicts L2 by reading a buffer of several L2s: what stays is the buffer's clean lines."""
    import torch

    _flush_buffer(torch).sum()


def cold_time(fn, reps: int = 40, warmup: int = 5) -> float:
    """Median seconds of the GPU work `fn` queues, each launch after flush_l2. The flush (a ~60 us read) runs
    while the host queues `fn`, so the host's launch path is hidden as in do_bench."""
    return event_time(fn, flush_l2, reps, warmup)


def event_time(fn, before, reps: int = 40, warmup: int = 5) -> float:
    """Median seconds of the GPU work `fn` queues, CUDA events around it only, `before()` queued ahead of each
    launch (a flush, or anything that keeps the GPU busy while the host catches up)."""
    import torch

    for _ in range(warmup):
        before()
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        before()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3
