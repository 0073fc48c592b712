"""Probe: how fast the local attention alone streams the KV cache, per launch configuration.

Times bsp's local phase of examples/flash_decode.tile (the split and merge kernels, `only=`) as a kernel time
(tilec.perf.bench_decode.kernel_time, as `tilec calibrate` times its copy: do_bench when it ran in session 4,
gpu_time.cold_time since) for a few (S, BS, num_warps, num_stages, keys per attend block), beside a copy of the
same K. B=1, 128 query heads, GQA 8:1, D=128, bf16, head-major KV.
Run on the device: python benchmarks/decode_local_probe.py > probe.log
"""

from __future__ import annotations

import sys

import torch

import tilec
from tilec.perf.bench_decode import COPY_GBPS, copy_gbps, kv_bytes, local_phase_time, make_inputs
from tilec.runtime import spawn

EX = "examples/flash_decode.tile"
# (S, BS, num_warps, num_stages, attend_block)
CONFIGS = [(s, bs, w, st, blk) for s, bss in ((32768, (512, 1024, 2048)), (65536, (1024, 2048)))
           for bs in bss for w, st, blk in ((4, 3, 64), (4, 4, 64), (4, 2, 128), (8, 3, 128), (8, 3, 64))]


def probe(heap):
    last_s = None
    for s, bs, warps, stages, block in CONFIGS:
        dims = dict(B=1, HKV=16, G=8, D=128, S=s)
        if s != last_s:
            q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
            print(f"S={s}: copy of K {copy_gbps(k, heap, 20):.0f} GB/s (read + write)", flush=True)
            last_s = s
        try:
            prog = tilec.compile(EX, world=1, schedule="bsp", dims={**dims, "BS": bs}, retype={"f16": "bf16"},
                                 num_warps=warps, num_stages=stages, attend_block=block)
            args = dict(Q=q, K=k, V=v, lens=lens, O=torch.empty(q.shape, dtype=q.dtype, device=heap.device))
            prog(heap, **args)
            secs = local_phase_time(prog, heap, args, 20)
            gbps = kv_bytes(dims, "bf16") / secs / 1e9
            print(f"S={s} BS={bs} warps={warps} stages={stages} block={block}: local phase {secs * 1e6:.1f} us "
                  f"{gbps:.0f} GB/s ({100 * gbps / COPY_GBPS:.1f}% of {COPY_GBPS:.0f})", flush=True)
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            print(f"S={s} BS={bs} warps={warps} stages={stages} block={block}: {type(e).__name__}: "
                  f"{str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    spawn("benchmarks.decode_local_probe:probe", 1, backend="iris", heap_bytes=1 << 28, timeout=600)
    sys.exit(0)
