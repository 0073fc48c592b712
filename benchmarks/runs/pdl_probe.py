"""Probe: what programmatic dependent launch (LaunchContext.pdl, the `pdl` compile option) saves between a call's
kernels.

examples/flash_decode.tile at B=1, D=128, GQA 8:1, bf16, head-major KV, each program compiled twice (pdl=False
and True, one CompiledProgram each), timed in the same run:
- bsp's local phase (split + merge kernels, `only=`, bench_decode.local_phase_time: cold L2, median);
- bsp whole calls and fused-push whole calls (tilec bench's per-call timer, a barrier outside it);
- fused-push replayed from a CUDA graph (one kernel: PDL can only overlap it with the graph's epoch bump).
Run on the device: python benchmarks/runs/pdl_probe.py > pdl_probe.log
"""

from __future__ import annotations

import sys

import torch

import tilec
from tilec.perf.bench_decode import default_bs, kv_bytes, local_phase_time
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import median_time
from tilec.runtime import spawn

EX = "examples/flash_decode.tile"
SHAPES = ((12, 8192), (16, 8192), (12, 32768), (16, 32768))  # (HKV, S)


def _call(prog, heap, args):
    prog(heap, **args)  # the first call makes the launch context (from prog.options) and warms the kernels
    return lambda: prog(heap, entry_barrier=False, sync=False, **args)


def probe(heap):
    for hkv, s in SHAPES:
        dims = dict(B=1, HKV=hkv, G=8, D=128, S=s)
        bs = default_bs(dims, False)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        gbps = kv_bytes(dims, "bf16") / 1e3  # bytes / 1e3 / us = GB/s
        ref = None
        for sched in ("bsp", "fused-push"):
            for pdl in (False, True):
                prog = tilec.compile(EX, world=1, schedule=sched, dims={**dims, "BS": bs}, retype={"f16": "bf16"},
                                     pdl=pdl)
                args = dict(Q=q, K=k, V=v, lens=lens, O=torch.empty(q.shape, dtype=q.dtype, device=heap.device))
                call = _call(prog, heap, args)
                ref = args["O"].float() if ref is None else ref
                err = float((args["O"].float() - ref).abs().max())
                tag = f"H={hkv * 8} S={s} BS={bs} {sched:10s} PDL={int(pdl)}"
                if sched == "bsp":
                    us = local_phase_time(prog, heap, args, 20) * 1e6
                    print(f"{tag} local phase  {us:7.1f} us {gbps / us:5.0f} GB/s", flush=True)
                us = median_time(call, heap, 30, 5) * 1e6
                print(f"{tag} whole call   {us:7.1f} us; max diff to the first {err:.1e}", flush=True)
                if sched != "bsp":
                    graph = prog.capture(heap, **args)
                    us = median_time(lambda g=graph: g.replay(entry_barrier=False, sync=False), heap, 30, 5) * 1e6
                    print(f"{tag} graph replay {us:7.1f} us", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    spawn("benchmarks.runs.pdl_probe:probe", 1, backend="iris", heap_bytes=1 << 28, timeout=600)
    sys.exit(0)
