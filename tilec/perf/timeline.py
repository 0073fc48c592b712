"""Where a call's time went, from a timeline build (`tilec.compile(..., timeline=True)`).

Every task of such a build records, in one int64 row (stage, program, start, waited, end), the clock when it
started, when its flag waits were done and when it ended (%globaltimer on a GPU, one clock for all SMs;
perf_counter_ns on the CPU emulation). Summed per kernel this splits the call into:
  work         task time after its waits (loads, math, stores, releases)
  flag waits   task time spent polling flags (the price of removing barriers)
  idle         program time inside a kernel's span with no task running (load imbalance, tails)
  between      time from one kernel's last task to the next kernel's first: launch, and the host barrier where
               the schedule has one (the launch and bulk-synchronous taxes, measured)
The instrumentation itself costs two clock reads and one 40-byte store per task.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpan:
    name: str
    stages: tuple[str, ...]
    tasks: int
    programs: int  # program slots: the most tasks seen running at once (a persistent kernel: its grid)
    start_ns: int
    end_ns: int
    work_ns: int  # summed over tasks
    wait_ns: int
    # (stage, tasks, work ns, wait ns, first task's start, last task's end): a stage's span is its wall time
    per_stage: tuple[tuple[str, int, int, int, int, int], ...] = ()

    @property
    def span_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def idle_ns(self) -> int:
        return max(0, self.programs * self.span_ns - self.work_ns - self.wait_ns)


@dataclass(frozen=True)
class Timeline:
    kernels: tuple[KernelSpan, ...]

    @property
    def total_ns(self) -> int:
        return self.kernels[-1].end_ns - self.kernels[0].start_ns if self.kernels else 0

    @property
    def between_ns(self) -> int:
        return sum(max(0, b.start_ns - a.end_ns) for a, b in zip(self.kernels, self.kernels[1:], strict=False))

    def shares(self) -> dict[str, float]:
        """Fractions of the call: kernels' program-time split into work / flag waits / idle (scaled to the
        time inside kernels), plus the time between kernels."""
        total = self.total_ns or 1
        inside = total - self.between_ns
        prog_time = sum(k.programs * k.span_ns for k in self.kernels) or 1
        scale = inside / total / prog_time
        return {
            "work": sum(k.work_ns for k in self.kernels) * scale,
            "flag waits": sum(k.wait_ns for k in self.kernels) * scale,
            "idle": sum(k.idle_ns for k in self.kernels) * scale,
            "between kernels": self.between_ns / total,
        }

    def render(self) -> str:
        lines = [f"call: {self.total_ns / 1e3:.1f} us, between kernels {self.between_ns / 1e3:.1f} us"]
        for k in self.kernels:
            pt = k.programs * k.span_ns or 1
            lines.append(f"  {k.name}: {k.span_ns / 1e3:.1f} us, {k.tasks} tasks on up to {k.programs} at once;"
                         f" work {100 * k.work_ns / pt:.0f}%, flag waits {100 * k.wait_ns / pt:.0f}%,"
                         f" idle {100 * k.idle_ns / pt:.0f}%")
            for name, n, work, wait, first, last in k.per_stage if len(k.per_stage) > 1 else ():
                lines.append(f"    stage {name}: {n} tasks over {(last - first) / 1e3:.1f} us (first start to last"
                             f" end), {work / n / 1e3:.2f} us work + {wait / n / 1e3:.2f} us waiting per task")
        return "\n".join(lines)


def summarize(records, module, stage_names: list[str]) -> Timeline:
    """records: the TIMELINE buffer as a [slots, 5] int64 tensor or nested list; module: the generated module."""
    rows = records.tolist() if hasattr(records, "tolist") else list(records)
    spans, base = [], 0
    # each kernel's records: its tasks, folded stages' included (fold-last runs them inside their producers' tasks,
    # whose records end before them: no time is in two records)
    sizes = getattr(module, "TIMELINE_KERNEL_SLOTS", None) or [k[1] for k in module.KERNELS]
    for (k, *_rest), total in zip(module.KERNELS, sizes, strict=True):
        mine = [r for r in rows[base:base + total] if r[4]]  # a task that ran has an end time
        base += total
        if not mine:
            continue
        spans.append(KernelSpan(
            k.__name__ if hasattr(k, "__name__") else str(k),
            tuple(dict.fromkeys(stage_names[r[0]] for r in mine)),
            len(mine), _peak([(r[2], r[4]) for r in mine]), min(r[2] for r in mine), max(r[4] for r in mine),
            sum(r[4] - r[3] for r in mine), sum(r[3] - r[2] for r in mine), _per_stage(mine, stage_names)))
    return Timeline(tuple(spans))


def timeline(prog, heap=None) -> Timeline:
    """Where this rank's last call of `prog` (a timeline build) went."""
    from tilec.ir.graph import stages

    return summarize(prog.timeline_records(heap), prog.module, [x.name for x in stages(prog.graph)])


def _per_stage(rows, stage_names: list[str]) -> tuple[tuple[str, int, int, int, int, int], ...]:
    """Per stage (in program order): tasks, work and wait time summed over them (a task's work includes its flag
    releases: a slow release shows as work per task of the producing stage), first start and last end."""
    out = {}
    for r in rows:
        n, work, wait, first, last = out.get(r[0], (0, 0, 0, r[2], r[4]))
        out[r[0]] = (n + 1, work + r[4] - r[3], wait + r[3] - r[2], min(first, r[2]), max(last, r[4]))
    return tuple((stage_names[i], *out[i]) for i in sorted(out))


def _peak(intervals: list[tuple[int, int]]) -> int:
    """Most intervals open at one instant (ends before starts at a tie: back-to-back tasks share a slot)."""
    events = sorted([(e, 0) for _, e in intervals] + [(s, 1) for s, _ in intervals])
    now = best = 0
    for _, starts in events:
        now += 1 if starts else -1
        best = max(best, now)
    return max(best, 1)


def rank_timelines(heap, progs, calls: int = 2, read=None) -> dict:
    """In each rank process: run each timeline build `calls` times (the first compiles and warms up) on bench
    inputs; per schedule, `read(prog, heap)` of the last call (default: its Timeline), read before the heap space
    of the call is released."""
    from tilec.perf.inputs import bench_inputs

    out = {}
    for p in progs:
        mark = heap.mark()
        try:
            args = bench_inputs(p, heap, 0)
            for _ in range(calls):
                p(heap, **args)
            out[p.schedule] = (read or timeline)(p, heap)
        finally:
            heap.release(mark)
    return out


