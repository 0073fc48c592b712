"""Probe: what do_bench's L2 flush charges a short memory-bound kernel.

triton.testing.do_bench flushes L2 between launches by zeroing a 256 MB buffer, which leaves L2 full of *dirty*
lines: the timed kernel's first reads evict them, so it pays the write-back of up to an L2 of someone else's
data. A 48 us kernel (H96 S32K: 201 MB of KV at 4.2 TB/s) cannot hide ~50 MB of extra writes. Timed here, with
CUDA events around each launch, median, for the copy of K and bsp's local phase of examples/flash_decode.tile (split +
merge, and each alone), under four flushes:
- zero: do_bench's (cache.zero_());
- read: a read of the same 256 MB buffer (L2 left holding clean lines);
- zero+read: the zero, then the read (the zero's dirty lines written back before the timer starts);
- none: no flush (what stays in L2 from the previous launch may hit).
Run on the device: python benchmarks/runs/flush_probe.py > flush_probe.log
"""

from __future__ import annotations

import sys

import torch

import tilec
from tilec.perf.bench_decode import COPY_GBPS, default_bs, kv_bytes
from tilec.perf.gpu_time import event_time
from tilec.perf.inputs import make_inputs
from tilec.runtime import spawn

EX = "examples/flash_decode.tile"
SHAPES = ((12, 32768), (16, 32768), (12, 65536), (16, 65536), (12, 131072))  # (HKV, S)


def flushes():
    buf = torch.empty(256 << 20, dtype=torch.int8, device="cuda")

    def read():
        buf.view(torch.int32).sum(dtype=torch.int64)

    return {"zero": buf.zero_, "read": read, "zero+read": lambda: (buf.zero_(), read()), "none": lambda: None}


def probe(heap):
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}: L2 {props.L2_cache_size >> 20} MB, {props.multi_processor_count} SMs", flush=True)
    fl = flushes()
    for hkv, s in SHAPES:
        dims = dict(B=1, HKV=hkv, G=8, D=128, S=s)
        bs = default_bs(dims, False)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        nbytes = kv_bytes(dims, "bf16")
        prog = tilec.compile(EX, world=1, schedule="bsp", dims={**dims, "BS": bs}, retype={"f16": "bf16"})
        args = dict(Q=q, K=k, V=v, lens=lens, O=torch.empty(q.shape, dtype=q.dtype, device=heap.device))
        prog(heap, **args)
        dst = torch.empty_like(k)

        def phase(only, prog=prog, args=args):
            return lambda: prog(heap, entry_barrier=False, sync=False, only=only, **args)

        fns = {"copy of K": (lambda dst=dst, k=k: dst.copy_(k), 2 * k.numel() * k.element_size()),
               "local phase": (phase((0, 1)), nbytes), "split alone": (phase((0,)), nbytes),
               "merge alone": (phase((1,)), None)}
        for fname, flush in fl.items():
            for name, (fn, n) in fns.items():
                us = event_time(fn, flush, reps=60) * 1e6
                share = f"{n / us / 1e3:5.0f} GB/s = {n / us / 1e3 / COPY_GBPS:.2f} of 4.2 TB/s" if n else ""
                print(f"H={hkv * 8} S={s} BS={bs} flush={fname:9s} {name:12s}: {us:7.1f} us {share}", flush=True)
        del q, k, v, dst
        torch.cuda.empty_cache()


if __name__ == "__main__":
    spawn("benchmarks.runs.flush_probe:probe", 1, backend="iris", heap_bytes=1 << 28, timeout=600)
    sys.exit(0)
