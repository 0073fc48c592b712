"""`tilec run`: generate inputs, run the compiled kernels on W ranks, compare every output with the reference."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tilec.program import CompiledProgram
from tilec.reference import TORCH_DTYPE, evaluate

TOLERANCE = {"f16": 2e-2, "bf16": 6e-2, "f32": 1e-4, "i32": 0.0}


def make_inputs(prog: CompiledProgram, rank: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic inputs of one rank (what `tilec run` feeds every schedule and the reference)."""
    out = {}
    for i, t in enumerate(prog.program.tensors):
        if t.kind != "in":
            continue
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + i)
        if t.dtype == "i32":  # integers (lengths, counts) up to the largest extent the program spans
            high = max([v for _, v in prog.program.dims] + [1]) * prog.world + 1
            out[t.name] = torch.randint(0, high, t.shape, generator=g, dtype=torch.int32)
        else:
            out[t.name] = torch.randn(t.shape, generator=g).to(TORCH_DTYPE[t.dtype])
    return out


def rank_worker(heap, prog: CompiledProgram, inputs: dict[str, torch.Tensor], repeat: int = 1):
    """Runs in each rank process: place inputs on the heap, call the program `repeat` times, return outputs."""
    args = {}
    for name, (kind, dtype, shape, _sym) in prog.signature().items():
        t = heap.alloc(shape, TORCH_DTYPE[dtype])
        if kind == "in":
            t.copy_(inputs[name].to(t.device))
        args[name] = t
    times = []
    for _ in range(repeat):
        for n, (kind, *_r) in prog.signature().items():
            if kind == "out":
                args[n].fill_(float("nan") if args[n].dtype.is_floating_point else -1)  # stale results can't pass
        t0 = time.perf_counter()
        prog(heap, **args)
        times.append(time.perf_counter() - t0)
    outs = {n: args[n].detach().cpu().clone() for n, (kind, *_r) in prog.signature().items() if kind == "out"}
    return outs, times


@dataclass
class Comparison:
    tensor: str
    rank: int
    max_abs_err: float
    rel_err: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tolerance


def compare(prog: CompiledProgram, outs: list[dict[str, torch.Tensor]], inputs: list[dict[str, torch.Tensor]],
            device: str = "cpu"):
    ref = evaluate(prog.program, inputs, device)
    rows = []
    for r in range(prog.world):
        for name, got in outs[r].items():
            want = ref[r][name].float().cpu()
            diff = (got.float() - want).abs()
            err = float("inf") if torch.isnan(diff).any() else float(diff.max()) if diff.numel() else 0.0
            scale = max(1.0, float(want.abs().max()) if want.numel() else 1.0)
            dt = prog.program.tensor(name).dtype
            rows.append(Comparison(name, r, err, err / scale, TOLERANCE[dt]))
    return rows


def heap_bytes_for(prog: CompiledProgram) -> int:
    need = sum(t.numel * torch.tensor([], dtype=TORCH_DTYPE[t.dtype]).element_size() for t in prog.program.tensors)
    return max(1 << 24, 2 * need + (1 << 20))


def run_program(prog: CompiledProgram, *, backend: str = "cpu", repeat: int = 2, seed: int = 0,
                heap_bytes: int | None = None, timeout: float = 600.0):
    """Run on `prog.world` spawned ranks; returns (comparisons, per-rank call times)."""
    from tilec.runtime import spawn

    inputs = [make_inputs(prog, r, seed) for r in range(prog.world)]
    results = spawn(_spawned, prog.world, backend=backend, heap_bytes=heap_bytes or heap_bytes_for(prog),
                    timeout=timeout, args=(prog, inputs, repeat))
    outs = [r[0] for r in results]
    return compare(prog, outs, inputs), [r[1] for r in results]


def run_program_torchrun(prog: CompiledProgram, heap, *, repeat: int = 2, seed: int = 0):
    """Under torchrun: this process is one rank. Rank 0 gathers every rank's outputs and compares them;
    returns (comparisons or None on other ranks, this rank's call times)."""
    import torch.distributed as dist

    inputs = [make_inputs(prog, r, seed) for r in range(prog.world)]
    outs, times = rank_worker(heap, prog, inputs[heap.rank], repeat)
    gathered = [None] * heap.world if heap.rank == 0 else None
    dist.gather_object(outs, gathered, dst=0)
    return (compare(prog, gathered, inputs, str(heap.device)) if heap.rank == 0 else None), times


def _spawned(heap, prog, inputs, repeat):
    return rank_worker(heap, prog, inputs[heap.rank], repeat)
