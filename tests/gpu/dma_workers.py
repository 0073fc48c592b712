"""Rank-side code of the copy-engine (transport=dma) GPU tests (importable by spawned rank processes)."""

from __future__ import annotations

from pathlib import Path

import torch

import tilec
from tilec.reference import TORCH_DTYPE

ROOT = Path(__file__).resolve().parents[2]


def _compile(heap, program: str, schedule: str, dims: dict, dtype: str, granularity: str):
    path = ROOT / program
    return tilec.compile(str(path), world=heap.world, schedule=schedule, dims=dims, retype={"f16": dtype},
                         granularity=granularity, transport="dma")


def _inputs(prog, heap, call: int):
    """Every rank's inputs of one call (the same on every rank, so each can compute the reference)."""
    per_rank = []
    for r in range(heap.world):
        d = {}
        for i, (name, (kind, dtype, shape, _sym)) in enumerate(prog.signature().items()):
            if kind == "in":
                g = torch.Generator().manual_seed(1000 * call + 10 * r + i)
                d[name] = torch.randn(shape, generator=g).to(TORCH_DTYPE[dtype])
        per_rank.append(d)
    return per_rank


def _want(program: str, ins: list[dict], rank: int) -> torch.Tensor:
    cols = program.endswith("ag_gemm_k.tile")
    a = torch.cat([d["A"].float() for d in ins], dim=1 if cols else 0)
    return a @ ins[rank]["B"].float()


def dma_cases(heap, cases, calls: int = 3):
    """cases: (program, schedule, granularity, dtype, dims). Returns [(case, max relative error per call)]."""
    out = []
    for case in cases:
        program, schedule, granularity, dtype, dims = case
        prog = _compile(heap, program, schedule, dims, dtype, granularity)
        mark = heap.mark()
        args = {n: heap.alloc(shape, TORCH_DTYPE[dt]) for n, (_k, dt, shape, _s) in prog.signature().items()}
        errs = []
        for call in range(calls):
            ins = _inputs(prog, heap, call)
            for n, t in ins[heap.rank].items():
                args[n].copy_(t)
            args["C"].fill_(float("nan"))
            prog(heap, **args)
            want = _want(program, ins, heap.rank)
            got = args["C"].float().cpu()
            errs.append(float((got - want).abs().max() / want.abs().max().clamp(min=1)))
        heap.release(mark)
        out.append((case, errs))
    return out


def captured(heap, schedule: str, replays: int = 4):
    """One dma call captured as a CUDA graph, replayed on new inputs: the flags take the epoch from the EPOCH cell
    the graph bumps on the device."""
    program, dims = "examples/ag_gemm.tile", {"M": 256 * heap.world, "N": 192, "K": 160}
    prog = _compile(heap, program, schedule, dims, "bf16", "auto")
    args = {n: heap.alloc(shape, TORCH_DTYPE[dt]) for n, (_k, dt, shape, _s) in prog.signature().items()}
    ins = _inputs(prog, heap, 0)
    for n, t in ins[heap.rank].items():
        args[n].copy_(t)
    call = prog.capture(heap, **args)
    errs = []
    for i in range(1, replays + 1):
        ins = _inputs(prog, heap, i)
        for n, t in ins[heap.rank].items():
            args[n].copy_(t)
        args["C"].fill_(float("nan"))
        call.replay()
        want = _want(program, ins, heap.rank)
        errs.append(float((args["C"].float().cpu() - want).abs().max() / want.abs().max().clamp(min=1)))
    prog(heap, **args)  # an ordinary call after replays: the counters keep counting
    want = _want(program, ins, heap.rank)
    errs.append(float((args["C"].float().cpu() - want).abs().max() / want.abs().max().clamp(min=1)))
    return errs


def kernels_of_a_call(heap):
    """The GPU kernels one dma call launches (torch profiler): the GEMM only; the copies and flag writes are
    memcpys on the copy engines."""
    from torch.profiler import ProfilerActivity, profile

    program, dims = "examples/ag_gemm.tile", {"M": 256 * heap.world, "N": 192, "K": 160}
    prog = _compile(heap, program, "flags", dims, "bf16", "auto")
    args = {n: heap.alloc(shape, TORCH_DTYPE[dt]) for n, (_k, dt, shape, _s) in prog.signature().items()}
    prog(heap, **args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        prog(heap, **args)
        torch.cuda.synchronize()
    names = sorted({e.name for e in p.events() if e.device_type.name == "CUDA"})
    return names
