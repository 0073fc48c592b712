"""Per-task clocks of a timeline build as a Chrome / Perfetto trace (`tilec taxes --timeline --trace out.json`).

The trace-event JSON opens in https://ui.perfetto.dev and chrome://tracing:
  process  one per (schedule, rank), named "rank R · SCHEDULE"
  thread   one track per program of a persistent kernel ("KERNEL · program P"); a kernel with one program per task
           has its tasks packed onto as few tracks as never overlap ("KERNEL · slot S")
  slices   a task is a complete event ("X") named by its stage and tile ("gemm m=64 n=128"), and the flag waits it
           did first are a slice of their own nested at its start ("wait F1, F2")
Times are microseconds from the first task of the schedule's call over all ranks (each rank's clock: one clock for
every SM of a GPU, %globaltimer; perf_counter_ns on the CPU emulation, one clock for every rank).
`plot` draws the same records as a PNG (matplotlib): one row per track, colored by stage, waits hatched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from tilec.errors import TilecError
from tilec.ir.types import ME


@dataclass(frozen=True)
class Task:
    """One slot of a timeline build: which kernel, stage and tile it records."""

    kernel: str
    persistent: bool
    stage: str
    tile: str  # "m=64 n=128": the loop values of the task (element offsets for tile loops, ranks for rank loops)
    waits: tuple[str, ...]  # flags the stage waits on


def _group_m(source: str) -> int:
    m = re.search(r"^# launch: .*group_m=(\d+)", source, re.M)
    return int(m.group(1)) if m else 8


def decode(loops, t: int, grouped_m: int, rank: int = 0) -> dict[str, int]:
    """Loop values of task t of a stage on `rank`, as the generated kernel decodes them (tilec.codegen.tasks):
    row-major over the loops, except a reduction's output tile, whose last two loops go in grouped order; a derived
    variable (a peer or index piece, ir/peers.py) is computed from the others and the rank."""
    derived = [v for v in loops if v.derived is not None]
    loops = [v for v in loops if v.derived is None]
    vals: dict[str, int] = {}
    grouped = grouped_m > 1 and len(loops) >= 2 and all(not v.is_rank and v.trips > 1 for v in loops[-2:])
    rest = t
    if grouped:
        m, n = loops[-2:]
        tv = t % (m.trips * n.trips)
        size = grouped_m * n.trips
        first = (tv // size) * grouped_m
        rows = min(m.trips - first, grouped_m)
        vals[m.name] = (first + (tv % size) % rows) * m.step
        vals[n.name] = ((tv % size) // rows) * n.step
        rest = t // (m.trips * n.trips)
    for v in reversed(loops[:-2] if grouped else loops):
        vals[v.name] = (rest % v.trips) * (1 if v.is_rank else v.step)
        rest //= v.trips
    for v in derived:
        vals[v.name] = v.derived.evaluate({**vals, ME: rank})
    return vals


def tasks(prog) -> list[Task]:
    """What each record slot of a timeline build of `prog` (a CompiledProgram) is: kernels in launch order, their
    stages in order, each stage's tasks by task number (the slot layout of tilec.codegen.emit.build_model)."""
    from tilec.ir.graph import kernels_of, stage, waits
    from tilec.ir.types import Sum, trips

    g = prog.graph
    gm = _group_m(prog.source)
    out = []
    for k in kernels_of(g):
        for sname in k.stages:
            st = stage(g, sname)
            has_sum = any(isinstance(s.value, Sum) for s in st.body)  # as the kernel: grouped order for reductions
            flags = tuple(sorted({w.flag for w in waits(g, sname)}))
            shown = [v for v in st.loops if v.trips > 1]
            for t in range(trips(st.loops)):
                vals = decode(st.loops, t, gm if has_sum else 1)
                out.append(Task(k.name, k.persistent, sname, " ".join(f"{v.name}={vals[v.name]}" for v in shown),
                                flags))
    return out


def records(prog, heap) -> list[list[int]]:
    """The raw records of this rank's last call of a timeline build: [stage, program, start, waited, end] per slot
    (end 0: the task did not run)."""
    return prog.timeline_records(heap).tolist()


def rank_traces(heap, progs, calls: int = 2) -> dict[str, tuple]:
    """In each rank process: per schedule, the last call's (Timeline, raw records) of a timeline build."""
    from tilec.perf.timeline import rank_timelines, timeline

    return rank_timelines(heap, progs, calls, read=lambda p, h: (timeline(p, h), records(p, h)))


# -- the trace --------------------------------------------------------------------------------------


def _tracks(rows: list[tuple[Task, list[int]]]) -> dict[int, tuple[str, list[tuple[Task, list[int]]]]]:
    """Slices per track: a persistent kernel's program runs its tasks one after another, so it is a track; tasks of
    a kernel with one program per task go greedily onto the first slot free at their start."""
    tracks: dict[tuple[str, int], list] = {}
    slot_end: dict[str, list[int]] = {}
    for task, r in sorted(rows, key=lambda x: (x[1][2], x[1][4])):
        if task.persistent:
            key = (task.kernel, r[1])
        else:
            ends = slot_end.setdefault(task.kernel, [])
            i = next((i for i, e in enumerate(ends) if e <= r[2]), len(ends))
            ends[i:i + 1] = [r[4]]
            key = (task.kernel, -1 - i)
        tracks.setdefault(key, []).append((task, r))
    out = {}
    for i, ((kernel, p), items) in enumerate(sorted(tracks.items(), key=lambda kv: (min(r[2] for _, r in kv[1]),
                                                                                      kv[0]))):
        name = f"{kernel} · program {p}" if p >= 0 else f"{kernel} · slot {-1 - p}"
        out[i + 1] = (name, items)
    return out


def build(progs, per_rank: list[dict[str, list[list[int]]]]) -> dict:
    """The trace-event JSON object of every schedule's call on every rank. progs: the timeline builds (one per
    schedule); per_rank[r][schedule]: rank r's raw records (`records`)."""
    events: list[dict] = []
    slices: list[dict] = []
    for si, prog in enumerate(progs):
        layout = tasks(prog)
        ran = {r: [(layout[i], row) for i, row in enumerate(recs[prog.schedule]) if row[4]]
               for r, recs in enumerate(per_rank)}
        if len(layout) != max((len(recs[prog.schedule]) for recs in per_rank), default=len(layout)):
            raise TilecError(f"{prog.schedule}: {len(layout)} tasks in the program, records of a different build")
        base = min((row[2] for rows in ran.values() for _, row in rows), default=0)
        for rank, rows in ran.items():
            pid = si * len(per_rank) + rank + 1
            events.append(_meta("process_name", pid, 0, name=f"rank {rank} · {prog.schedule}"))
            events.append(_meta("process_sort_index", pid, 0, sort_index=pid))
            for tid, (tname, items) in _tracks(rows).items():
                events.append(_meta("thread_name", pid, tid, name=tname))
                events.append(_meta("thread_sort_index", pid, tid, sort_index=tid))
                for task, (_s, program, start, waited, end) in items:
                    name = f"{task.stage} {task.tile}".strip()
                    args = {"stage": task.stage, "tile": task.tile, "kernel": task.kernel, "program": program,
                            "wait_us": (waited - start) / 1e3, "schedule": prog.schedule, "rank": rank}
                    slices.append(_slice(name, "task", pid, tid, start - base, end - start, args))
                    if task.waits and waited > start:  # without waits the gap is only the clock reads
                        label = "wait " + ", ".join(task.waits)
                        slices.append(_slice(label, "flag wait", pid, tid, start - base, waited - start,
                                             {"flags": list(task.waits)}))
    # per track by start; at one start the longer slice (the task) first, so its wait nests inside it
    slices.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    return {"traceEvents": events + slices, "displayTimeUnit": "ns",
            "otherData": {"generator": "tilec", "schedules": [p.schedule for p in progs],
                          "program": progs[0].program.name if progs else "", "world": len(per_rank)}}


def _meta(what: str, pid: int, tid: int, **args) -> dict:
    return {"name": what, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": args}


def _slice(name: str, cat: str, pid: int, tid: int, start_ns: int, dur_ns: int, args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start_ns / 1e3, "dur": dur_ns / 1e3,
            "args": args}


def write(trace: dict, path) -> None:
    from tilec.ir.dot import write_atomic

    write_atomic(path, json.dumps(trace, separators=(",", ":")))


# -- a picture of it --------------------------------------------------------------------------------


def plot(trace: dict, path, title: str = "") -> None:
    """One row per track (rank and program), one panel per schedule; tasks colored by stage, flag waits hatched."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise TilecError("--trace-png needs matplotlib, which is not installed (pip install matplotlib, or "
                         "pip install -e '.[bench]')") from None
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"
             and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"
               and e["name"] == "thread_name"}
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    schedules = list(dict.fromkeys(procs[p].split(" · ", 1)[1] for p in sorted(procs)))
    stages = list(dict.fromkeys(e["args"]["stage"] for e in xs if e["cat"] == "task"))
    colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(stages)}
    rows = {s: [k for k in sorted(threads) if procs[k[0]].endswith(" · " + s)] for s in schedules}
    heights = [max(1, len(r)) for r in rows.values()]
    # CPU emulation calls last ~1 s, GPU calls tens of us: label the axis in a unit that fits
    scale, unit = (1e3, "ms") if max((e["ts"] + e["dur"] for e in xs), default=0) > 1e4 else (1.0, "us")
    fig, axes = plt.subplots(len(schedules), 1, figsize=(10, 0.9 + 0.32 * sum(heights) + 0.5 * len(schedules)),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    for ax, s in zip(axes[:, 0], schedules, strict=True):
        y = {k: i for i, k in enumerate(rows[s])}
        for e in xs:
            k = (e["pid"], e["tid"])
            if k not in y:
                continue
            if e["cat"] == "task":
                ax.barh(y[k], e["dur"] / scale, left=e["ts"] / scale, height=0.7, color=colors[e["args"]["stage"]],
                        edgecolor="white", linewidth=0.4)
            else:
                ax.barh(y[k], e["dur"] / scale, left=e["ts"] / scale, height=0.7, color="none", edgecolor="black",
                        hatch="////", linewidth=0.4)
        ax.set_yticks(range(len(y)), [f"{procs[k[0]].split(' · ')[0]} · {threads[k]}" for k in y], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(s, fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1, 0].set_xlabel(f"{unit} from the first task of the call")
    handles = [Patch(color=colors[s], label=f"stage {s}") for s in stages]
    handles.append(Patch(facecolor="none", edgecolor="black", hatch="////", label="flag wait"))
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles))
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    import io

    from tilec.ir.dot import write_atomic

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
