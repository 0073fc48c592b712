"""Rank-side code of the GPU tests (importable by spawned rank processes)."""

from __future__ import annotations

import torch

import tilec
from tilec.reference import TORCH_DTYPE

SCHEDULES = ("bsp", "flags", "fused-pull", "fused-push")


def ag_gemm_cases(heap, cases, calls: int = 3):
    """cases: list of (schedule, dtype, M, N, K). For each: compile, run `calls` times with fresh inputs, compare
    with torch (cat of every rank's shard @ B, f32). Returns [(case, max relative error per call)]."""
    out = []
    for sched, dtype, m, n, k in cases:
        prog = tilec.compile("examples/ag_gemm.tile", world=heap.world, schedule=sched,
                             dims={"M": m, "N": n, "K": k}, retype={"f16": dtype})
        mark = heap.mark()
        dt = TORCH_DTYPE[dtype]
        a = heap.alloc((m // heap.world, k), dt)
        b = heap.alloc((k, n), dt)
        c = heap.alloc((m, n), dt)
        errs = []
        for call in range(calls):
            shards = [torch.randn(m // heap.world, k, generator=torch.Generator().manual_seed(100 * call + r))
                      for r in range(heap.world)]
            bb = torch.randn(k, n, generator=torch.Generator().manual_seed(7 + call))
            a.copy_(shards[heap.rank].to(dt))
            b.copy_(bb.to(dt))
            c.fill_(float("nan"))
            prog(heap, A=a, B=b, C=c)
            want = torch.cat([s.to(dt).float() for s in shards]) @ bb.to(dt).float()
            err = ((c.float().cpu() - want).abs().max() / want.abs().max().clamp(min=1)).item()
            errs.append(err)
        heap.release(mark)
        out.append(((sched, dtype, m, n, k), errs))
    return out


def _ag_gemm_bf16(heap, schedule: str, m: int, n: int, k: int):
    """examples/ag_gemm.tile in bf16 and its A, B, C on the heap."""
    prog = tilec.compile("examples/ag_gemm.tile", world=heap.world, schedule=schedule,
                         dims={"M": m, "N": n, "K": k}, retype={"f16": "bf16"})
    a = heap.alloc((m // heap.world, k), torch.bfloat16)
    return prog, a, heap.alloc((k, n), torch.bfloat16), heap.alloc((m, n), torch.bfloat16)


def many_calls(heap, schedule: str, calls: int = 40):
    """One program called `calls` times back to back (sync=False between checks): every call's C against torch,
    and the number of kernels Triton compiled (epoch changes every call and must not cause recompiles)."""
    m, n, k = 256, 256, 128
    prog, a, b, c = _ag_gemm_bf16(heap, schedule, m, n, k)
    errs = []
    for call in range(calls):
        shards = [torch.randn(m // heap.world, k, generator=torch.Generator().manual_seed(10 * call + r))
                  for r in range(heap.world)]
        bb = torch.randn(k, n, generator=torch.Generator().manual_seed(call))
        a.copy_(shards[heap.rank].to(torch.bfloat16))
        b.copy_(bb.to(torch.bfloat16))
        prog(heap, A=a, B=b, C=c)
        want = torch.cat([s.to(torch.bfloat16).float() for s in shards]) @ bb.to(torch.bfloat16).float()
        errs.append(((c.float().cpu() - want).abs().max() / want.abs().max()).item())
    mod = prog.module
    dev = torch.cuda.current_device()
    compiled = {k.__name__: len(k.device_caches[dev][0]) for k, *_rest in mod.KERNELS}
    return errs, compiled


def captured_ag_gemm(heap, schedule: str, replays: int = 4):
    """All-Gather + GEMM captured as a CUDA graph and replayed on new shards written into the same A and B (peers
    pull A during a call, so a replay ends with the exit barrier); returns each replay's relative error."""
    m, n, k = 256, 256, 128
    prog, a, b, c = _ag_gemm_bf16(heap, schedule, m, n, k)
    call = prog.capture(heap, A=a, B=b, C=c)
    errs = []
    for i in range(replays):
        shards = [torch.randn(m // heap.world, k, generator=torch.Generator().manual_seed(10 * i + r))
                  for r in range(heap.world)]
        bb = torch.randn(k, n, generator=torch.Generator().manual_seed(50 + i))
        a.copy_(shards[heap.rank].to(torch.bfloat16))
        b.copy_(bb.to(torch.bfloat16))
        c.fill_(float("nan"))
        call.replay()
        want = torch.cat([s.to(torch.bfloat16).float() for s in shards]) @ bb.to(torch.bfloat16).float()
        errs.append(((c.float().cpu() - want).abs().max() / want.abs().max()).item())
    return errs
