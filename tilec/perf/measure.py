"""How tilec times a call: CUDA events around the call only, a cross-rank barrier before each (outside the
timer), the median; tuned configs cached per device."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tilec import settings

CPU_KEY = "cpu-interpreter"  # measurements of the CPU emulation: kept apart from every GPU's


def this_device() -> str:
    """The device whose measurements this process reads: the GPU's name, or CPU_KEY without one."""
    try:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else CPU_KEY
    except Exception:  # noqa: BLE001 - no torch GPU support: the CPU key
        return CPU_KEY


def device_key(heap) -> str:
    """The device a heap's kernels run on: CPU_KEY under the interpreter (even on a machine with a GPU)."""
    return CPU_KEY if heap.interpret else torch.cuda.get_device_name(heap.device)


def kernel_backend(heap_backend: str, ranks_per_node: int | None = None, options: dict | None = None) -> dict:
    """The tilec.compile keywords of the kernels a bench, trial or auto pick compiles for a heap of `heap_backend`:
    backend nvshmem on an NVSHMEM heap, or wherever ranks_per_node is given (the CPU emulation runs those kernels
    too), none (Iris's kernels) else; and the compile options given (settings.OPTIONS: fold, pdl, ...)."""
    given = settings.given_options(options)
    if heap_backend == "nvshmem" or ranks_per_node:
        return {"backend": "nvshmem", "ranks_per_node": ranks_per_node, **given}
    return given


# what a row measured with ranks sharing a GPU says (gpu_sharing's answer -> label)
SHARING_LABEL = {"mps": "one GPU split by MPS, links through HBM",
                 "time-sliced": "ranks time-slice one GPU (no MPS): not side by side"}
MPS_NOTE = (SHARING_LABEL["mps"] + ": {world} ranks run side by side, each on {sms} SMs; the times measure barriers,"
            " launches, flag waits and overlap, not NVLink")
TIME_SLICED_NOTE = ("ranks share {gpus} GPU(s) (world {world}) without MPS: they time-slice it, so the measured times"
                    " say nothing about the barrier (BSP) tax of {world} GPUs")


def gpu_sharing(world: int) -> str:
    """How `world` ranks of this host share its GPUs: "" (a GPU per rank), "mps" (side by side, each on its share of
    the SMs: benchmarks/runs/mps_world.sh) or "time-sliced" (one rank's kernels at a time)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus or world <= gpus:
        return ""
    from tilec.runtime.launch import mps_client

    return "mps" if mps_client() else "time-sliced"


def mps_sms() -> int:
    """The SMs this process's share gives it (what multi_processor_count reports under MPS)."""
    return torch.cuda.get_device_properties(0).multi_processor_count


def sharing_note(world: int, how: str | None = None) -> str:
    """The label of measured rows where ranks share a GPU ("" where each has its own); how: gpu_sharing(world)'s
    answer where the caller has it."""
    how = gpu_sharing(world) if how is None else how
    if how == "mps":
        return MPS_NOTE.format(world=world, sms=mps_sms())
    if how == "time-sliced":
        return TIME_SLICED_NOTE.format(gpus=torch.cuda.device_count(), world=world)
    return ""


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def tune_cache() -> Path:
    from tilec.program import cache_dir

    return cache_dir() / "tune.json"


def load_tuned() -> dict:
    """The tuned tile configs recorded so far (key -> config), {} when none."""
    from tilec.fileio import read_json

    return read_json(tune_cache())


def store_tuned(found: dict) -> None:
    """Merge this run's tuned configs into the cache under its lock (concurrent benches lose no record)."""
    from tilec.fileio import update_json

    if found:
        update_json(tune_cache(), lambda d: d.update(found))


def _samples_us(fn, heap, iters: int, warmup: int, before=None) -> list[float]:
    """Microseconds of `iters` runs of fn after `warmup` untimed ones, a cross-rank barrier (and `before()`, e.g.
    an L2 flush) ahead of each, outside the timer: CUDA events on a GPU, the wall clock on the CPU emulation."""
    for _ in range(warmup):
        heap.barrier()
        fn()
    out = []
    for _ in range(iters):
        heap.barrier()
        if before is not None:
            before()
        if heap.interpret:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            heap.finish_gpu_work()  # the end event, bounded: kernels stuck outside their waits raise KernelsStuck
            out.append(start.elapsed_time(end) * 1e3)
    return out


def median_time(fn, heap, iters: int, warmup: int) -> float:
    """Median of per-call times (seconds); a barrier before each call, outside the timed region."""
    return statistics.median(_samples_us(fn, heap, iters, warmup)) / 1e6


# -- device time and host time of one row (tilec bench) -----------------------------------------------------------

GRAPH = "cuda graph replay, L2 flushed by a read and a cross-rank barrier before each, outside the events"
EVENTS = "cuda events around an eager call (no graph: a host barrier inside the call, or capture failed)"
WALL = "wall clock of an eager call (CPU emulation: no device timer)"


@dataclass
class Timing:
    """Device time (median and spread over `iters` timed runs, warm-up excluded) and host time of one op."""

    device_us: float
    p10_us: float
    p90_us: float
    min_us: float
    max_us: float
    iters: int
    how: str  # GRAPH, EVENTS or WALL
    host_us: float | None = None  # one eager Python call, wall clock until its device work is done (median)
    peak_bytes: int | None = None  # allocator peak of one eager call beyond what was allocated before it


def spread(samples_us: list[float]) -> tuple[float, float, float, float, float]:
    """(median, p10, p90, min, max) of samples (nearest-rank percentiles)."""
    xs = sorted(samples_us)
    if not xs:
        raise ValueError("no samples")

    def pct(p: float) -> float:
        return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]

    return statistics.median(xs), pct(0.1), pct(0.9), xs[0], xs[-1]


def capture_graph(fn):
    """fn() recorded as a CUDA graph (after warm-up on a side stream, as torch requires), or None where it cannot
    be captured (a host sync inside, a collective the backend cannot record)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        torch.cuda.synchronize()
        return graph
    except Exception:  # noqa: BLE001 - not capturable: timed eagerly instead, and the row says so
        torch.cuda.synchronize()
        return None


def time_op(fn, heap, iters: int = 20, warmup: int = 3, replay=None, capture: bool = True,
            host_iters: int = 5) -> Timing:
    """Times fn (one eager call of an op) on every rank alike. Device time: `replay` (a CUDA graph replay of the
    same op; captured here from fn when None and `capture`), else fn itself, between CUDA events, each run after
    an L2 flush that reads (gpu_time.flush_l2) and a cross-rank barrier, both outside the events. Host time: one
    eager call of fn from Python until its device work is done. On the CPU emulation both are wall clock."""
    iters = max(1, iters)
    if heap.interpret:
        med, p10, p90, lo, hi = spread(_samples_us(fn, heap, iters, warmup))
        return Timing(med, p10, p90, lo, hi, iters, WALL, host_us=med)
    from tilec.perf.gpu_time import flush_l2

    for _ in range(warmup):
        heap.barrier()
        fn()
    heap.finish_gpu_work()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    heap.finish_gpu_work()
    peak = max(0, torch.cuda.max_memory_allocated() - base)
    graph = None
    if replay is None and capture:
        graph = capture_graph(fn)
        replay = graph.replay if graph is not None else None
    samples = _samples_us(replay or fn, heap, iters, warmup, before=flush_l2)
    host = []
    for _ in range(host_iters):
        heap.barrier()
        t0 = time.perf_counter()
        fn()
        heap.finish_gpu_work()  # polls back to back for 5 ms, then every 0.1 ms (runtime/gpu_wait.py)
        host.append((time.perf_counter() - t0) * 1e6)
    med, p10, p90, lo, hi = spread(samples)
    del graph
    return Timing(med, p10, p90, lo, hi, iters, GRAPH if replay is not None else EVENTS,
                  host_us=statistics.median(host), peak_bytes=peak)


class progress:  # noqa: N801 - used like tqdm
    """Steps of a long run: a tqdm bar on a terminal (each step's line printed above it), `[i/n] line` lines
    through `log` otherwise; nothing when log is None (ranks other than 0)."""

    def __init__(self, total: int, desc: str, log):
        self.total, self.n, self.log = total, 0, log
        self.bar = None
        if log is not None and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)
            except ImportError:
                self.bar = None

    def step(self, line: str = "") -> None:
        self.n += 1
        if self.log is None:
            return
        if self.bar is not None:
            self.bar.write(f"[{self.n}/{self.total}] {line}", file=sys.stderr)
            self.bar.update(1)
        else:
            self.log(f"[{self.n}/{self.total}] {line}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def capturable(prog, heap) -> bool:
    """Whether CompiledProgram.capture takes this program here: a GPU, no host barrier inside a call, one node."""
    return prog.capture_refusal(heap) is None


def time_program(prog, heap, args: dict, iters: int, warmup: int = 2, host_iters: int = 5) -> Timing:
    """A compiled program's Timing on `args` (tensors on the heap): device time of its CUDA graph's replays where
    the schedule can be captured (no host barrier inside a call), else of eager calls; bracketed by synchronous
    calls, so a wait that timed out during the unsynchronized timed calls is raised, not missed."""
    prog(heap, **args)  # compiles, checks the arguments, sizes the grids
    replay = None
    if capturable(prog, heap):
        call = prog.capture(heap, **args)
        replay = lambda: call.replay(entry_barrier=False, sync=False)  # noqa: E731
    t = time_op(lambda: prog(heap, entry_barrier=False, sync=False, **args), heap, iters, warmup, replay=replay,
                capture=False, host_iters=host_iters)
    prog(heap, **args)
    return t
