"""Probe: what limits the single persistent flash-decode kernel (fused-push, world 1) on one GPU.

Times whole calls of examples/flash_decode.tile (tilec.perf.bench.time_checked: CUDA events, median of 20) for a few
(S, BS, num_warps, programs per SM) (`tilec bench` has the SDPA baseline). Run on the device:
    python benchmarks/decode_probe.py > probe.log
"""

from __future__ import annotations

import sys

import torch

import tilec
import tilec.program as tp
from tilec.perf.bench import time_checked
from tilec.perf.bench_decode import kv_bytes, make_inputs
from tilec.runtime import spawn

EX = "examples/flash_decode.tile"
# (S, BS, num_warps, num_stages, programs per SM cap, noinline task functions, keys per attend block). Grids are
# sized by occupancy up to the cap (LaunchContext.fit), so a config whose programs do not fit that many per SM
# gets fewer.
CONFIGS = [
    (131072, 4096, 4, 3, 1, False, 64), (131072, 4096, 4, 3, 2, False, 64), (131072, 4096, 4, 3, 2, True, 64),
    (131072, 4096, 4, 4, 2, True, 64), (131072, 4096, 8, 3, 2, True, 64), (131072, 4096, 4, 3, 4, True, 64),
    (131072, 4096, 4, 3, 2, True, 128), (131072, 4096, 8, 3, 2, True, 128), (131072, 4096, 4, 4, 1, False, 128),
    (8192, 256, 4, 3, 2, False, 64), (8192, 256, 4, 3, 2, True, 64), (8192, 256, 4, 3, 4, True, 64),
]


def _one(heap, sms, s, bs, warps, stages, per_sm, noinline, block):
    dims = dict(B=1, HKV=16, G=8, D=128, S=s)
    q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")  # the example is head-major
    prog = tilec.compile(EX, world=1, schedule="fused-push", dims={**dims, "BS": bs}, retype={"f16": "bf16"},
                         num_warps=warps, num_stages=stages, noinline_tasks=noinline, attend_block=block)
    o = torch.empty(q.shape, dtype=q.dtype, device=heap.device)
    tp.MAX_PROGRAMS_PER_SM = per_sm  # the cap fit() applies at the first call (TILEC_PROGRAMS_PER_SM)
    us = time_checked(prog, heap, dict(Q=q, K=k, V=v, lens=lens, O=o), 20, 3) * 1e6
    fitted = prog.programs_per_sm(heap)
    return us, kv_bytes(dims, "bf16") / us / 1e3, fitted


def probe(heap):
    sms = torch.cuda.get_device_properties(heap.device).multi_processor_count
    for cfg in CONFIGS:
        s, bs, warps, stages, per_sm, noinline, block = cfg
        try:
            us, gbps, fitted = _one(heap, sms, *cfg)
            print(f"S={s} BS={bs} warps={warps} stages={stages} cap={per_sm} programs/SM={fitted} noinline={noinline}"
                  f" block={block}: {us:.1f} us {gbps:.0f} GB/s", flush=True)
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            print(f"S={s} BS={bs} warps={warps} programs/SM={per_sm}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    spawn("benchmarks.decode_probe:probe", 1, backend="iris", heap_bytes=1 << 28, timeout=600)
    sys.exit(0)
