"""`tilec run`: generate inputs, run the compiled kernels on W ranks, compare every output with the reference."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tilec.errors import ArgumentError
from tilec.ir.gather import index_inputs
from tilec.program import CompiledProgram
from tilec.reference import TORCH_DTYPE, evaluate

TOLERANCE = {"f16": 2e-2, "bf16": 6e-2, "f32": 1e-4, "i32": 0.0}


def make_inputs(prog: CompiledProgram, rank: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic inputs of one rank (what `tilec run` feeds every schedule and the reference)."""
    out = {}
    rows = index_inputs(prog.program.items)  # row indexes and counts (ir/gather.py): in range
    for i, t in enumerate(prog.program.tensors):
        if t.kind != "in":
            continue
        g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 7919 + i)
        if t.name in rows:
            what, n = rows[t.name]
            if what == "unique" and t.numel <= n:  # a scatter's rows: distinct
                out[t.name] = torch.randperm(n, generator=g)[:t.numel].to(torch.int32).reshape(t.shape)
            elif what == "count":
                out[t.name] = torch.full(t.shape, n, dtype=torch.int32)
            else:
                out[t.name] = torch.randint(0, n, t.shape, generator=g, dtype=torch.int32)
        elif t.dtype == "i32":  # integers (lengths, counts) up to the largest extent the program spans
            high = max([v for _, v in prog.program.dims] + [1]) * prog.world + 1
            out[t.name] = torch.randint(0, high, t.shape, generator=g, dtype=torch.int32)
        else:
            out[t.name] = torch.randn(t.shape, generator=g).to(TORCH_DTYPE[t.dtype])
    return out


def rank_worker(heap, prog: CompiledProgram, calls: list[dict[str, torch.Tensor]]):
    """Runs in each rank process: place each call's inputs in the same heap tensors, call the program once per
    entry of `calls` (new inputs every call, so an output left from the previous call cannot pass), and return
    every call's outputs with the call times."""
    args = {}
    for name, (_kind, dtype, shape, _sym) in prog.signature().items():
        args[name] = heap.alloc(shape, TORCH_DTYPE[dtype])
    times, outs = [], []
    for inputs in calls:
        for n, (kind, dtype, *_r) in prog.signature().items():
            if kind == "in":
                args[n].copy_(inputs[n].to(args[n].device))
            elif kind == "out":
                args[n].fill_(_poison(dtype).item())  # stale results can't pass
        t0 = time.perf_counter()
        prog(heap, **args)
        times.append(time.perf_counter() - t0)
        outs.append({n: args[n].detach().cpu().clone() for n, (kind, *_r) in prog.signature().items()
                     if kind == "out"})
    return outs, times


def _poison(dtype: str) -> torch.Tensor:
    """What an output holds before each call of `tilec run`."""
    return torch.tensor(-1 if dtype == "i32" else float("nan"))


@dataclass
class Comparison:
    tensor: str
    rank: int
    max_abs_err: float
    rel_err: float
    tolerance: float
    call: int = 0

    @property
    def ok(self) -> bool:
        return self.rel_err <= self.tolerance


def output_error(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(max absolute error, that over max(1, max |want|)) of an output against its reference. Elements equal on
    both sides count as exact, inf and -inf included, and so do NaNs where the reference has NaN; any other
    non-finite value on either side is an infinite error."""
    got, want = got.float().cpu(), want.float().cpu()
    if got.shape != want.shape:
        return float("inf"), float("inf")
    if not got.numel():
        return 0.0, 0.0
    same = (got == want) | (torch.isnan(got) & torch.isnan(want))
    finite = torch.isfinite(got) & torch.isfinite(want)
    if not (same | finite).all():
        return float("inf"), float("inf")
    diff = torch.where(same, 0.0, got - want).abs()
    err = float(diff.max())
    ref = want.abs()[torch.isfinite(want)]
    scale = max(1.0, float(ref.max()) if ref.numel() else 1.0)
    return err, err / scale


def compare(prog: CompiledProgram, outs: list[dict[str, torch.Tensor]], inputs: list[dict[str, torch.Tensor]],
            device: str = "cpu", call: int = 0):
    """One call's outputs of every rank (outs[rank]) against the reference interpreter on the same inputs."""
    # elements of an output the program never writes keep rank_worker's poison: compared equal, not wrong
    ref = evaluate(prog.program, inputs, device, {t.name: _poison(t.dtype) for t in prog.program.tensors
                                                  if t.kind == "out"})
    rows = []
    for r in range(prog.world):
        for name, got in outs[r].items():
            err, rel = output_error(got, ref[r][name])
            rows.append(Comparison(name, r, err, rel, TOLERANCE[prog.program.tensor(name).dtype], call))
    return rows


def call_inputs(prog: CompiledProgram, repeat: int, seed: int = 0) -> list[list[dict[str, torch.Tensor]]]:
    """inputs[call][rank]: different for every call and every rank."""
    if repeat < 1:
        raise ArgumentError(f"repeat={repeat}: must be >= 1 (calls per schedule)")
    return [[make_inputs(prog, r, seed + c) for r in range(prog.world)] for c in range(repeat)]


def compare_calls(prog, outs_per_rank, inputs, device: str = "cpu") -> list[Comparison]:
    """outs_per_rank[rank][call] against the reference of each call's inputs."""
    rows = []
    for c, per_rank in enumerate(inputs):
        rows += compare(prog, [outs_per_rank[r][c] for r in range(prog.world)], per_rank, device, c)
    return rows


def heap_bytes_for(prog: CompiledProgram) -> int:
    need = sum(t.numel * torch.tensor([], dtype=TORCH_DTYPE[t.dtype]).element_size() for t in prog.program.tensors)
    return max(1 << 24, 2 * need + (1 << 20))


def run_program(prog: CompiledProgram, *, backend: str = "cpu", repeat: int = 2, seed: int = 0,
                heap_bytes: int | None = None, timeout: float = 600.0):
    """Run `repeat` calls (new inputs each) on `prog.world` spawned ranks; returns (comparisons of every call,
    per-rank call times)."""
    from tilec.runtime import spawn

    inputs = call_inputs(prog, repeat, seed)
    results = spawn(_spawned, prog.world, backend=backend, heap_bytes=heap_bytes or heap_bytes_for(prog),
                    timeout=timeout, args=(prog, inputs))
    return compare_calls(prog, [r[0] for r in results], inputs), [r[1] for r in results]


def run_program_torchrun(prog: CompiledProgram, heap, *, repeat: int = 2, seed: int = 0):
    """Under torchrun: this process is one rank. Rank 0 gathers every rank's outputs and compares them;
    returns (comparisons or None on other ranks, this rank's call times)."""
    import torch.distributed as dist

    inputs = call_inputs(prog, repeat, seed)
    outs, times = rank_worker(heap, prog, [c[heap.rank] for c in inputs])
    gathered = [None] * heap.world if heap.rank == 0 else None
    dist.gather_object(outs, gathered, dst=0)
    return (compare_calls(prog, gathered, inputs, str(heap.device)) if heap.rank == 0 else None), times


def _spawned(heap, prog, inputs):
    return rank_worker(heap, prog, [c[heap.rank] for c in inputs])
