"""Short timed trials of every legal schedule: the measured half of `--schedule auto` (`tilec tune`).

The cost model ranks the schedules first (tilec.perf.auto.candidates); trials then time each one for a few calls on
the ranks at hand and record the times in the auto cache under this program, shape, world and device (the GPU's
name; the CPU emulation's under its own key, never read by a GPU's choice), so later
`--schedule auto` compiles pick the fastest measured schedule (and `tilec show --schedules` prints both).

Trials are collective: every rank compiles and calls the same schedules in the same order, and the time kept
for a schedule is the slowest rank's median (all-reduced), so every rank records and picks the same one.
Timing follows tilec.perf.bench (measure.time_program): device time, CUDA graph replays where the schedule can be
captured, a barrier and an L2 flush before each, outside the timer.
"""

from __future__ import annotations

from dataclasses import dataclass

from tilec.errors import ScheduleError, TilecError


@dataclass(frozen=True)
class Trial:
    schedule: str
    predicted_us: float
    measured_us: float | None  # None: it failed, see note
    note: str = ""


def _max_over_ranks(x: float, world: int) -> float:
    import torch
    import torch.distributed as dist

    if world == 1 or not (dist.is_available() and dist.is_initialized()):
        return x
    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def trial_rank(heap, path: str, dims: dict[str, int], iters: int = 5, warmup: int = 2, granularity: str = "auto",
               retype: dict[str, str] | None = None, record: bool = True, log=None,
               ranks_per_node: int | None = None, options: dict | None = None) -> list[Trial]:
    """In every rank: time each legal schedule (model order) for `iters` calls; returns the trials, fastest
    measured first (the same list on every rank). On an NVSHMEM heap (or with ranks_per_node) the kernels are
    backend nvshmem's and their times are recorded apart from Iris's (measure.kernel_backend); options: tilec.compile
    options of every variant (settings.OPTIONS), whose times are recorded under a key of their own."""
    import tilec
    from tilec.perf.auto import candidates, compile_variant, device_key, key, record_measured
    from tilec.perf.inputs import bench_inputs
    from tilec.perf.measure import kernel_backend, progress, time_program

    kernels = kernel_backend(heap.backend, ranks_per_node, options)
    base = tilec.compile(path, heap.world, "bsp", dims, granularity=granularity, retype=retype, **kernels)
    source = base.program.source  # the auto cache is keyed by the program text, as `tilec bench` records it
    device = device_key(heap)  # the CPU emulation's times have their own key, never read for a GPU
    ranked = candidates(base, source, heap.world, dims, dict(base.program.dims), granularity, device, kernels=kernels)
    k = key(source, heap.world, dict(base.program.dims), device, kernels=kernels)
    bar = progress(len(ranked), "tune", log if heap.rank == 0 else None)
    out = []
    for row in ranked:
        s = row["schedule"]
        try:  # the same on every rank: a refused variant is skipped by all, before any collective
            prog = compile_variant(path, heap.world, s, dims, granularity=granularity, retype=retype,
                                   **kernels)  # e.g. flags+dma
        except ScheduleError as e:
            out.append(Trial(s, row["predicted_us"], None, f"ScheduleError: {e}"))
            bar.step(f"{s:<11} refused ({e})")
            continue
        mark = heap.mark()
        try:
            us = time_program(prog, heap, bench_inputs(prog, heap, 0), iters, warmup, host_iters=1).device_us
            note = ""
        except TilecError as e:  # reported, not fatal: the other schedules still get their trial
            us, note = float("inf"), f"{type(e).__name__}: {e}"
        finally:
            heap.release(mark)
        us = _max_over_ranks(us, heap.world)
        measured = None if us == float("inf") else us
        if record and measured is not None and heap.rank == 0:
            record_measured(k, s, measured)
        out.append(Trial(s, row["predicted_us"], measured, note))
        shown = f"{measured:.1f} us" if measured is not None else f"failed ({note})"
        bar.step(f"{s:<11} predicted {row['predicted_us']:.1f} us, measured {shown}")
    bar.close()
    return sorted(out, key=lambda t: (t.measured_us is None, t.measured_us or 0.0))


def _spawned(heap, path, dims, iters, warmup, granularity, retype, ranks_per_node=None, options=None):
    return trial_rank(heap, path, dims, iters, warmup, granularity, retype, log=lambda m: print(m, flush=True),
                      ranks_per_node=ranks_per_node, options=options)


def run_trials(path: str, world: int, dims: dict[str, int], *, backend: str = "cpu", iters: int = 5,
               warmup: int = 2, granularity: str = "auto", retype: dict[str, str] | None = None,
               heap_bytes: int | None = None, timeout: float = 1800.0,
               ranks_per_node: int | None = None, options: dict | None = None) -> list[Trial]:
    """Spawns `world` ranks on `backend` and runs trial_rank in each; returns rank 0's trials."""
    import tilec
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import spawn

    if heap_bytes is None:  # the largest schedule's tensors, inputs included, twice over
        base = tilec.compile(path, world, "bsp", dims, granularity=granularity, retype=retype)
        heap_bytes = 4 * heap_bytes_for(base)
    res = spawn(_spawned, world, backend=backend, heap_bytes=heap_bytes, timeout=timeout,
                args=(path, dims, iters, warmup, granularity, retype, ranks_per_node, options))
    return res[0]
