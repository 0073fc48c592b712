"""`tilec taxes` (what each schedule pays in the three taxes) and `tilec calibrate` (measure a machine file).

tilec.cli.commands wires them in with `add_parser(subparsers)`; `python -m tilec.cli.taxes ...` runs them on their own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tilec.cli.args import _option_flags, run_command, transport_arg
from tilec.errors import TilecError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("taxes", help="what each schedule pays in launch, bulk-synchronous and locality tax")
    p.add_argument("program", help="a .tile file")
    p.add_argument("--world", "-w", type=int, default=None, help="number of ranks (default: WORLD_SIZE or 1)")
    p.add_argument("-D", dest="dims", action="append", metavar="NAME=INT", help="set a dim or tile size")
    p.add_argument("--granularity", default="auto", choices=("auto", "tile", "rank", "tensor"), help="flag granularity")
    p.add_argument("--machine", metavar="JSON", help="machine file from `tilec calibrate` (default: H200, docs/GPU.md)")
    p.add_argument("--plot", metavar="PNG", help="write stacked bars of each schedule's time (needs matplotlib)")
    p.add_argument("--measure", action="store_true", help="also time every schedule on the GPUs (CUDA events)")
    p.add_argument("--timeline", action="store_true",
                   help="also run a timeline build of every schedule (in-kernel clocks per task) and split each"
                   " call into work, flag waits, idle and time between kernels")
    p.add_argument("--trace", metavar="JSON", help="with --timeline: write every rank's per-task clocks as a Chrome /"
                   " Perfetto trace (opens in ui.perfetto.dev and chrome://tracing)")
    p.add_argument("--trace-png", metavar="PNG", help="with --timeline: draw the same trace (one row per program;"
                   " needs matplotlib)")
    p.add_argument("--num-warps", type=int, default=None, help="warps per program of the measured kernels (default:"
                   " with --measure / --timeline on a GPU, the tuned config's, else 4)")
    p.add_argument("--num-stages", type=int, default=None, help="software-pipeline stages (default: likewise, else 3)")
    p.add_argument("--transport", default="sm", type=transport_arg, metavar="MODE",
                   help="who moves the tiles of copy stages: sm, dma, auto (both: SCHEDULE and SCHEDULE+dma rows, as"
                   " --schedule auto weighs them) or STAGE=MODE,... (default sm)")
    _option_flags(p.add_argument_group("compile options of every schedule (default: the value in brackets)"))
    p.set_defaults(fn=cmd_taxes)
    p = subparsers.add_parser("calibrate", help="measure this GPU's rates into a machine file for `tilec taxes`")
    p.add_argument("-o", "--output", default="machine.json", help="where to write it (default: machine.json)")
    p.set_defaults(fn=cmd_calibrate)


def cmd_taxes(args) -> int:
    from tilec.cli.args import _dims, _option_values, _world
    from tilec.perf.auto import default_machine
    from tilec.perf.bench import measured_tiles
    from tilec.perf.measure import gpu_sharing, sharing_note
    from tilec.perf.model import Machine
    from tilec.perf.taxes import gpu_count, taxes

    if args.plot:  # an unwritable path is refused before anything is computed
        from tilec.fileio import output_path

        output_path(args.plot)
    world = _world(args)
    machine = Machine.load(args.machine) if args.machine else default_machine(world)
    _check_trace_args(args)
    measure = args.measure and gpu_count() > 0
    dims, launch, tiles = _dims(args.dims), {"num_warps": args.num_warps, "num_stages": args.num_stages}, ""
    if measure or (args.timeline and gpu_count() > 0):  # time the tiles a GPU run would use, not the defaults
        dims, launch, tiles = measured_tiles(args.program, world, dims, launch)
    launch = {**{k: v for k, v in launch.items() if v is not None}, **_option_values(args)}
    args.resolved = (dims, launch)
    rows = taxes(args.program, world, dims, machine, granularity=args.granularity, measure=measure,
                 launch={**launch, "transport": "sm" if args.transport == "auto" else args.transport})
    if args.transport == "auto":  # both transports, as `--schedule auto` weighs them: SCHEDULE+dma rows beside
        from dataclasses import replace

        from tilec.perf.auto import DMA, variant
        from tilec.perf.taxes import TaxRow

        dma = taxes(args.program, world, dims, machine, granularity=args.granularity, measure=measure,
                    launch={**launch, "transport": DMA})
        rows += [replace(r, schedule=variant(r.schedule, DMA)) for r in dma if isinstance(r, TaxRow)]
    sharing = gpu_sharing(world) if measure else ""
    print(render(args.program, rows, machine, sharing == "time-sliced"))
    if tiles:
        print(tiles)
    if args.measure and not measure:
        print("measured: needs a CUDA GPU (none is visible here); the predicted columns need none")
    if sharing:
        print("note: " + sharing_note(world, sharing) + ("; the BSP tax column is n/a" if sharing == "time-sliced"
                                                          else ""))
    if args.timeline:
        tracing = bool(args.trace or args.trace_png)
        timelines, builds, records = measure_timelines(args, world, records=True) if tracing else \
            (measure_timelines(args, world), (), ())
        print(render_timelines(timelines))
        if tracing and builds:
            _write_traces(args, world, builds, records)
    if args.plot:
        plot(rows, args.plot, f"{args.program}, world {world}")
        print(f"wrote {args.plot}")
    return 0


def measure_timelines(args, world: int, records: bool = False):
    """schedule -> the slowest rank's Timeline of one call of a timeline build (after a warm-up call). records: also
    the builds and every rank's raw records ({schedule: rows} per rank), for a trace."""
    from tilec.cli.args import _dims
    from tilec.perf.taxes import Skipped, compile_all
    from tilec.perf.timeline import rank_timelines
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import default_backend, spawn

    dims, launch = getattr(args, "resolved", (_dims(args.dims), {}))
    launch = {**launch, "timeline": True, "transport": getattr(args, "transport", "sm")}
    builds = [p for p in compile_all(args.program, world, dims, granularity=args.granularity,
                                     launch=launch) if not isinstance(p, Skipped)]
    if not builds:
        return ({}, (), ()) if records else {}
    fn = rank_timelines
    if records:  # the same runs, keeping each rank's raw records
        from tilec.perf.trace import rank_traces as fn
    per_rank = spawn(fn, world, backend=default_backend(), timeout=1800, args=(builds,),
                     heap_bytes=sum(heap_bytes_for(p) for p in builds))
    raw = [{s: recs for s, (_t, recs) in r.items()} for r in per_rank] if records else ()
    if records:
        per_rank = [{s: t for s, (t, _recs) in r.items()} for r in per_rank]
    slowest = {p.schedule: max((r[p.schedule] for r in per_rank), key=lambda t: t.total_ns) for p in builds}
    return (slowest, builds, raw) if records else slowest


def _check_trace_args(args) -> None:
    """--trace / --trace-png: need --timeline, and a file they can be written to (checked before the runs)."""
    from tilec.ir.dot import check_output_path

    for flag, path in (("--trace", args.trace), ("--trace-png", args.trace_png)):
        if path is None:
            continue
        if not args.timeline:
            raise TilecError(f"{flag} {path}: needs --timeline (the trace is the timeline build's per-task clocks)")
        check_output_path(path, flag)


def _write_traces(args, world: int, builds, records) -> None:
    from tilec.perf import trace

    tr = trace.build(builds, records)
    if args.trace:
        trace.write(tr, args.trace)
        print(f"wrote {args.trace} (Chrome / Perfetto trace: {len(builds)} schedule(s) x {world} rank(s))")
    if args.trace_png:
        trace.plot(tr, args.trace_png, f"{args.program}, world {world}: per-task clocks")
        print(f"wrote {args.trace_png}")


def render_timelines(timelines: dict) -> str:
    from tilec.runtime import default_backend

    lines = ["", "measured inside the kernels (timeline builds: per-task clocks; the slowest rank's call)"]
    if default_backend() == "cpu":
        lines.append("CPU emulation: programs run one at a time in the interpreter; the split says nothing about"
                     " a GPU")
    lines.append(f"{'schedule':<13}{'call':>11}{'between kernels':>17}{'work':>8}{'flag waits':>12}{'idle':>8}")
    for s, t in timelines.items():
        sh = t.shares()
        lines.append(f"{s:<13}{_us(t.total_ns / 1e3):>11}{_us(t.between_ns / 1e3):>17}"
                     f"{100 * sh['work']:>7.0f}%{100 * sh['flag waits']:>11.0f}%{100 * sh['idle']:>7.0f}%")
    for s, t in timelines.items():  # kernel by kernel, stage by stage
        lines.append(f"{s}: " + t.render().replace("\n", "\n  "))
    return "\n".join(lines)


def cmd_calibrate(args) -> int:
    from tilec.fileio import output_path
    from tilec.perf.model import calibrate

    output_path(args.output)  # refused before measuring, not after
    print("tilec calibrate: measuring this machine")
    m = calibrate()
    m.save(args.output)
    print(f"wrote {args.output} ({m.name}); use it with `tilec taxes ... --machine {args.output}`, and for"
          f" `--schedule auto` with TILEC_MACHINE={args.output}")
    return 0


# -- rendering --------------------------------------------------------------------------------------


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if n < 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _us(x: float) -> str:
    return f"{x:.1f} us" if x < 100 else f"{x:.0f} us"


def _pct(x: float) -> str:
    return f"({100 * x:.1f}%)"


def render(program: str, rows: list, machine, shared_gpu: bool = False) -> str:
    """The two tables of `tilec taxes`: exact static accounting, then the model's times (and measured ones)."""
    from tilec.perf.taxes import Skipped

    done = [r for r in rows if not isinstance(r, Skipped)]
    skipped = [r for r in rows if isinstance(r, Skipped)]
    head = f"tilec taxes {program}"
    if done:
        r0 = done[0]
        head += f": world {r0.world}, " + " ".join(f"{k}={v}" for k, v in r0.dims.items())
    out = [head, f"machine: {machine.name}; every number is per rank, per call", "",
           "static accounting (exact, from the compiled graph)"]
    sw = max(12, 1 + max((len(r.schedule) for r in rows), default=0))  # "fused-push+dma" needs more than 12
    cols = f"{'schedule':<{sw}}{'launches':>8}  {'barriers e+b+x':<15}{'HBM round trip (buffers)':<27}" \
           f"{'written':>10}{'read back':>11}{'remote rd':>11}{'remote wr':>11}{'releases':>10}{'waits':>11}" \
           f"{'GFLOP':>9}"
    out.append(cols)
    for r in done:
        inter, intra = ", ".join(r.roundtrip_tensors), ", ".join(r.intra_roundtrip_tensors)
        names = inter + (" + " if inter and intra else "") + (f"{intra} (intra)" if intra else "")
        names = names if len(names) <= 26 else names[:23] + "..."
        w = sum(x.write_bytes for x in r.roundtrips)
        rb = sum(x.read_bytes for x in r.roundtrips)
        bars = f"{r.barriers} = {r.barriers_entry}+{r.barriers_between}+{r.barriers_exit}"
        out.append(f"{r.schedule:<{sw}}{r.launches:>8}  {bars:<15}{names or '-':<27}{_bytes(w) if w else '-':>10}"
                   f"{_bytes(rb) if rb else '-':>11}{_bytes(r.remote_read_bytes):>11}"
                   f"{_bytes(r.remote_write_bytes):>11}{r.flag_releases:>10}{r.flag_waits:>11}{r.flops / 1e9:>9.4g}")
    for s in skipped:
        out.append(f"{s.schedule:<{sw}}skipped: {s.skipped}")
    for r in done:
        if r.copy_engine_stages:
            out.append(f"{r.schedule:<{sw}}transport dma: stage(s) {', '.join(r.copy_engine_stages)} on the copy"
                       f" engines (no kernel; releases are one per chunk): {_copy_engines(r)}")
    if any(r.intra_roundtrip_tensors for r in done):
        out.append("(intra): written and read inside one kernel; it still goes through memory, and the model charges"
                   " it once it exceeds L2")
    out += ["", "predicted (tilec.perf.model: compute and link traffic overlap, except across kernels run one after"
            " another; read back counts re-reads, the model only distinct bytes)"]
    out.append(f"{'schedule':<{sw}}{'compute':>10}{'comm':>10}  {'launch tax':<17}{'BSP tax = barriers + idle':<34}"
               f"{'locality tax':<19}{'flag waits':>11}{'predicted':>12}{'measured':>11}")
    for r in done:
        bsp = "n/a (shared GPU)" if shared_gpu else \
            f"{_us(r.bsp_tax_us)} {_pct(r.bsp_share)} = {r.barrier_us:.0f} + {r.serialization_us:.0f}"
        meas = _us(r.measured_us) if r.measured_us is not None else "-"
        out.append(f"{r.schedule:<{sw}}{_us(r.compute_us):>10}{_us(r.comm_us):>10}  "
                   f"{_us(r.launch_tax_us) + ' ' + _pct(r.launch_share):<17}{bsp:<34}"
                   f"{_us(r.locality_tax_us) + ' ' + _pct(r.locality_share):<19}{_us(r.flag_wait_us):>11}"
                   f"{_us(r.predicted_us):>12}{meas:>11}")
    for r in done:
        if r.copy_engine_us:
            hidden = "hidden under the kernels" if not r.copy_engine_exposed_us else \
                f"{_us(r.copy_engine_exposed_us)} beyond the kernels (in predicted)"
            out.append(f"{r.schedule:<{sw}}copy engines: {_us(r.copy_engine_us)} beside the kernels, {hidden}")
        if r.sm_copy_us:
            out.append(f"{r.schedule:<{sw}}SM copies: {_us(r.sm_copy_us)} of link time that holds the kernel's programs"
                       " (no other stage of the kernel runs meanwhile; in predicted)")
    if done:
        out.append("where the time goes (largest term):")
        out += [f"  {r.schedule:<{sw - 1}} {_dominant(r)}" for r in done]
        out.append(f"fastest predicted: {min(done, key=lambda r: r.predicted_us).schedule}")
    return "\n".join(out)


def _copy_engines(r) -> str:
    """A dma row's chunks on its busiest rank: how many, the bytes and the part of them over the link."""
    chunks = max(r.copy_engine_chunks, key=lambda cs: sum(c.bytes for c in cs), default=())
    link = sum(c.bytes for c in chunks if c.peer)
    streams = len({c.stream for c in chunks})
    return (f"{len(chunks)} chunk(s) on {streams} side stream(s), {_bytes(sum(c.bytes for c in chunks))}"
            f" ({_bytes(link)} over the link), {sum(c.copies for c in chunks)} issued copies")


def _dominant(r) -> str:
    """The largest term of a prediction, in words, with the count that drives it."""
    terms = {"compute": r.compute_us if r.compute_us >= r.comm_us else 0.0,
             "link": r.comm_us if r.comm_us > r.compute_us else 0.0,
             "bsp": r.bsp_tax_us, "locality": r.locality_tax_us, "launch": r.launch_tax_us, "flags": r.flag_wait_us,
             "sm copies": r.sm_copy_us, "copy engines": r.copy_engine_exposed_us}
    top = max(terms, key=terms.get)
    pct = f"{100 * terms[top] / r.predicted_us:.0f}%" if r.predicted_us else "-"
    return {
        "compute": f"compute {pct}",
        "link": f"link traffic {pct} ({_bytes(r.remote_read_bytes + r.remote_write_bytes)} to/from peers, re-reads"
                " included)",
        "bsp": f"BSP tax {pct} ({r.barriers} barrier(s), {r.serialization_us:.0f} us idle)",
        "locality": f"locality tax {pct}",
        "launch": f"launch tax {pct} ({r.launches} launch(es))",
        "flags": f"flag waits {pct} ({r.flag_waits} waits; try --granularity rank)",
        "sm copies": f"SM copies {pct} (link time of copy tasks in the kernel; try --transport dma)",
        "copy engines": f"copy engines {pct} (their copies outlast the kernels)",
    }[top]


def plot(rows: list, path: str, title: str) -> None:
    """Stacked bars per schedule: work (max of compute and comm), then each tax and the flag waits; measured as a
    marker where there is one."""
    from tilec.perf.taxes import Skipped

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TilecError("--plot needs matplotlib, which is not installed (pip install matplotlib, or "
                         "pip install -e '.[bench]')") from None
    done = [r for r in rows if not isinstance(r, Skipped)]
    parts = [("work: max(compute, comm)", "overlap_us", "#4c72b0"), ("BSP tax", "bsp_tax_us", "#dd8452"),
             ("locality tax", "locality_tax_us", "#55a868"), ("launch tax", "launch_tax_us", "#c44e52"),
             ("flag waits", "flag_wait_us", "#8172b3"), ("SM copies", "sm_copy_us", "#937860"),
             ("copy engines (beyond the kernels)", "copy_engine_exposed_us", "#da8bc3")]
    fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(done) + 2), 4))
    xs = range(len(done))
    bottom = [0.0] * len(done)
    for label, field, color in parts:
        ys = [getattr(r, field) for r in done]
        ax.bar(xs, ys, 0.6, bottom=bottom, label=label, color=color)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    meas = [(i, r.measured_us) for i, r in enumerate(done) if r.measured_us is not None]
    if meas:
        ax.scatter([i for i, _ in meas], [m for _, m in meas], marker="_", s=900, color="black", label="measured",
                   zorder=3)
    ax.set_xticks(list(xs), [r.schedule for r in done])
    ax.set_ylabel("us per call (per rank)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    from tilec.fileio import write_atomic

    write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format=Path(path).suffix[1:] or "png"))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tilec", description=__doc__)
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    return run_command(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
