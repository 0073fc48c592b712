"""The `tilec` command line: thin wrappers over the Python API. Errors print as one located line; exit codes follow
one rule for every subcommand (EXIT_CODES, printed by `tilec --help`)."""

from __future__ import annotations

import argparse
import sys
import time

from tilec.cli.args import _dims, _option_flags, _option_values, _world, run_command, transport_arg
from tilec.errors import TilecError
from tilec.passes.names import DESCRIPTIONS, PASS_NAMES, SCHEDULES, TRANSPORTS

HEAVY_SPILL = 4096  # bytes per thread a kernel spills before `check --target` says why (a tile too large)

EXIT_CODES = """exit status (every subcommand):
  0  everything asked for succeeded (schedules that do not apply to the program are listed by
     `check`, `run -s all`, `taxes` and `bench` without --schedules, and are not failures)
  1  tilec ran and found a wrong result: an output differs from the reference (run, bench), a
     schedule rejected by the verifier, failing in a pass, or failing to compile for --target (check)
  2  the request could not be carried out: bad arguments or usage, a program with errors or that no
     schedule applies to, a schedule named explicitly (-s, --schedules) that does not apply, an
     unwritable output path or standard output, a missing optional tool (graphviz for show --format
     svg/png, matplotlib for plots), a runtime error (a rank failed, a wait timed out, no GPU for calibrate)
  130 interrupted
  141 standard output closed before tilec was done (a pipe into `head`)"""


def _positive(text: str) -> int:
    """argparse type of counts that must be at least 1 (--repeat, --iters, --heap-mb)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: must be >= 1")
    return n


def _common(p: argparse.ArgumentParser, schedule: bool = True) -> None:
    p.add_argument("program", help="a .tile file")
    p.add_argument("--world", "-w", type=int, default=None, help="number of ranks (default: WORLD_SIZE or 1)")
    p.add_argument("-D", dest="dims", action="append", metavar="NAME=INT", help="set a dim or tile size")
    if schedule:
        p.add_argument("--schedule", "-s", default="auto", choices=("auto", *SCHEDULES), metavar="SCHEDULE",
                       help="auto: the cost model's pick (measured times win when `tilec bench` ran this shape);"
                       + "; ".join(f" {k}: {v}" for k, v in DESCRIPTIONS.items()) + " (default: auto)")
    p.add_argument("--granularity", default="auto", choices=("auto", "tile", "rank", "tensor"),
                   help="flag granularity (auto: per tile, whole along dims readers reduce over)")
    p.add_argument("--transport", default=None, type=transport_arg, metavar="MODE",
                   help="who moves the tiles of copy stages: sm (tasks on the SMs), dma (the copy engines, chunk by"
                   " chunk with a flag each; schedules with flags), auto (the cost model picks sm or dma), or per"
                   " stage: STAGE=MODE,... (e.g. gather=dma). Default: auto with --schedule auto, else sm")


def _settings(p: argparse.ArgumentParser, backend: bool = True) -> None:
    """The compile options (tilec.compile's keywords, tilec/settings.py OPTIONS) and the backend's (backend=False: the
    command's own --backend picks the heap, and nvshmem the kernels' backend)."""
    g = p.add_argument_group("compile options (default: the value in brackets)")
    if backend:
        g.add_argument("--backend", choices=("iris", "nvshmem"), help="how kernels reach peers (iris; nvshmem: "
                       "torch symmetric memory, peers off the node by puts and gets, docs/SCALE.md)")
    g.add_argument("--ranks-per-node", type=int, metavar="N", help="ranks of one node, reached by pointer (the "
                   "world; fewer: backend nvshmem)")
    _option_flags(g)


def _setting_values(args) -> dict:
    return {**_option_values(args), "ranks_per_node": getattr(args, "ranks_per_node", None),
            "backend": _kernel_backend(getattr(args, "backend", None), getattr(args, "ranks_per_node", None))}


def _built_with(options: dict) -> str:
    """The header's note of the compile options given (every program the command builds has them), as flags."""
    from tilec.settings import option_text

    flags = " ".join(f"--{k.replace('_', '-')} {option_text(v)}" for k, v in options.items())
    return f"; built with {flags}" if flags else ""


def _kernel_backend(backend: str | None, ranks_per_node: int | None) -> str | None:
    """The kernels' backend of a command's --backend and --ranks-per-node: nvshmem where asked, or where nodes are
    given and no backend is (a CPU heap runs NVSHMEM's kernels too); an explicit iris stays, so that iris with several
    nodes is refused naming both (an Iris heap reaches every peer by pointer)."""
    if backend == "iris":
        return backend
    return "nvshmem" if backend == "nvshmem" or ranks_per_node else None


def _compile(args, schedule: str | None = None):
    import tilec

    schedule = schedule or args.schedule
    transport = getattr(args, "transport", None)
    schedule, plus, variant = schedule.partition("+")  # a candidate of --schedule auto, e.g. flags+dma
    if plus:
        transport = variant
    if schedule == "auto" or transport == "auto":  # the model picks (the compiler reads transport=auto as sm)
        from tilec.perf.auto import compile_auto, variant_of  # the cost model (and torch) only where it picks

        prog = compile_auto(args.program, _world(args), _dims(args.dims), granularity=args.granularity,
                            transport=transport, schedule=None if schedule == "auto" else schedule,
                            **_setting_values(args))
        print(f"tilec: auto picked {variant_of(prog)} (schedule {prog.schedule}, copy stages on the"
              f" {'copy engines' if variant_of(prog).endswith('+dma') else 'SMs'})", file=sys.stderr)
        if prog.backend_note:
            print(f"tilec: {prog.backend_note}", file=sys.stderr)
        return prog
    return tilec.compile(args.program, world=_world(args), schedule=schedule, dims=_dims(args.dims),
                         granularity=args.granularity, transport=transport or "sm", **_setting_values(args))


def cmd_compile(args) -> int:
    if args.output:  # a path that cannot be written is refused before compiling
        from tilec.fileio import output_path

        output_path(args.output)
    prog = _compile(args)
    if args.output:
        prog.save(args.output)
        print(f"wrote {args.output} ({prog.schedule}, world {prog.world}, {prog.kernel_count}"
              " kernel(s))", file=sys.stderr)
    else:
        sys.stdout.write(prog.source)
    return 0


def cmd_show(args) -> int:
    if args.schedules:
        return _show_schedules(args)
    if args.source and args.format != "text":
        raise TilecError(f"--format {args.format}: --source prints the Triton source; --format draws the graph")
    if args.format == "png" and not args.output:
        raise TilecError("--format png: needs -o PATH (a PNG is not printed)")
    if args.output:
        from tilec.ir.dot import check_output_path

        check_output_path(args.output)
    prog = _compile(args)
    if args.source or args.format == "text":
        # the graph's text under the options it was compiled with (the source's header has them already)
        text = prog.source if args.source else f"# {prog.options.line()}\n{prog.show(args.after)}"
        if args.output:
            from tilec.ir.dot import write_atomic

            write_atomic(args.output, text)
        else:
            sys.stdout.write(text)
        return 0
    from tilec.ir.dot import RenderUnavailable

    try:
        out = prog.draw(args.after, args.format, args.output)
    except RenderUnavailable as e:  # the DOT text is written beside the path: say how to render it
        print(f"tilec show: {e}", file=sys.stderr)
        return e.exit_code
    if args.output:
        print(f"wrote {args.output} ({args.format}, schedule {prog.schedule})", file=sys.stderr)
    else:
        sys.stdout.write(out.decode() if isinstance(out, bytes) else out)
    return 0


def _bound(args, world: int):
    """The program of args parsed and bound to its dims at `world`."""
    from tilec.frontend.parser import parse_file
    from tilec.frontend.sema import check

    return check(parse_file(args.program), world, _dims(args.dims))


def _ranked(args, world: int, device: str | None = None, kernels: dict | None = None):
    """The program bound to its dims, and its legal schedules ranked by the model (times measured on `device`,
    default this process's GPU, with `kernels`' backend options, beside)."""
    from tilec.perf.auto import candidates

    bound = _bound(args, world)
    return bound, candidates(args.program, bound.source, world, _dims(args.dims), dict(bound.dims), args.granularity,
                             device, kernels=kernels)


def _show_schedules(args) -> int:
    bound, rows = _ranked(args, _world(args), kernels=_option_values(args) or None)
    print(f"schedules for {args.program}, world {_world(args)}, "
          + " ".join(f"{k}={v}" for k, v in bound.dims)
          + " (best first; `tilec tune` and `tilec bench` record measured times)")
    width = max([len("schedule"), *(len(r["schedule"]) for r in rows)]) + 2  # `fused-push+dma` fits too
    print(f"  {'schedule':<{width}}{'predicted':>12}{'measured':>12}")
    for r in rows:
        meas = f"{r['measured_us']:.0f} us" if r["measured_us"] is not None else "-"
        pred = f"{r['predicted_us']:.0f} us"
        print(f"  {r['schedule']:<{width}}{pred:>12}{meas:>12}")
    return 0


def cmd_check(args) -> int:
    """Parse, check and verify the program under every schedule; say which apply and why the others don't."""
    from tilec.errors import ArgumentError, CompileError, ScheduleError, TilecError, VerifyError

    _dims(args.dims), _world(args)  # a bad -D or --world is the user's argument, said once (exit 2)
    if args.target:  # a bad target is the user's argument, said once (exit 2), not a failure per schedule
        from tilec.codegen.target_check import parse_target

        parse_target(args.target)
    ok, failed, rejected, said = 0, 0, 0, None
    for s in SCHEDULES:
        try:
            prog = _compile(args, s)
            print(f"  {s:<11} verified: {prog.kernel_count} kernel(s), "
                  f"{sum(1 for _, d in prog.graph.nodes(data=True) if d['kind'] == 'flag')} flag(s)", flush=True)
            ok += 1
        except ScheduleError as e:  # does not apply: information, not a failure
            print(f"  {s:<11} {e}")
            continue
        except VerifyError as e:  # a rejected program (as sema's, exit 2), located; go on with the other schedules
            text = "\n".join(d.render(e.source) for d in e.diagnostics)
            same = text == said  # rejected after `lower`, before any pass of its own: said once
            print(f"  {s:<11} REJECTED by the verifier after pass '{e.pass_name}'{' (as above)' * same}"
                  f"{'' if same else ':'}", flush=True)
            if not same:
                print(text, flush=True)
            said = text
            rejected += 1
            continue
        except (CompileError, ArgumentError, BrokenPipeError):  # the program or an argument is wrong: said once
            raise
        except Exception as e:  # noqa: BLE001 - a pass that crashed is a failed schedule, like a rejection
            print(f"  {s:<11} FAILED in a pass: {type(e).__name__}: {e}")
            failed += 1
            continue
        if args.target:
            from tilec.codegen.target_check import compile_for_target

            try:
                built = compile_for_target(prog, args.target)
            except TilecError as e:  # the GPU compiler rejected a kernel the verifier accepted
                print(f"  {'':<11} {e}")
                failed += 1
                continue
            print(f"  {'':<11} compiled for {args.target}: " + ", ".join(b.describe() for b in built), flush=True)
            heavy = [b.kernel for b in built if (b.spilled or 0) >= HEAVY_SPILL]
            if heavy:  # a few hundred bytes is a GEMM at the register limit; kilobytes is a tile too large
                print(f"  {'':<11} {', '.join(heavy)}: a task's tiles are more than a program's registers hold; "
                      "smaller tiles (-D), or a long `:` tiled by a loop, keep them in registers", flush=True)
    verdict = ", ".join([f"{failed} schedule(s) failed"] * bool(failed) + [f"{rejected} rejected"] * bool(rejected))
    print(f"{args.program}: {verdict or 'ok'}, {ok} of {len(SCHEDULES)} schedules verified for world {_world(args)}")
    if rejected or failed:
        return 2 if rejected else 1
    if not ok:
        raise TilecError(f"{args.program}: no schedule applies to this program at world {_world(args)}")
    return 0


def _auto_pick(args, backend: str, world: int, torchrun: bool) -> str:
    """`run --schedule auto`: the model's pick, refined by short trials on a GPU (or with --trials) unless every
    legal schedule of this program, shape and world already has a measured time here."""
    from tilec.perf.auto import CPU_KEY
    from tilec.perf.measure import kernel_backend
    from tilec.perf.trials import run_trials

    kernels = kernel_backend(backend, args.ranks_per_node, _option_values(args)) or None
    _bound, rows = _ranked(args, world, CPU_KEY if backend == "cpu" else None, kernels)  # the times of what runs
    measured = all(r["measured_us"] is not None for r in rows)
    if not measured and (args.trials or backend != "cpu"):
        if torchrun:  # trials need every rank at once; under torchrun run `tilec tune` first
            print("tilec run: --schedule auto uses the model here; `torchrun ... -m tilec tune` measures first")
        else:
            print(f"tilec run: timing {len(rows)} schedule(s) briefly to pick one (tilec tune)", flush=True)
            trials = run_trials(args.program, world, _dims(args.dims), backend=backend,
                                granularity=args.granularity, ranks_per_node=args.ranks_per_node,
                                options=_option_values(args))
            best = next((t for t in trials if t.measured_us is not None), None)
            if best is not None:
                return best.schedule
    return rows[0]["schedule"]


def _auto_backend(args, backend: str, world: int) -> str:
    """`run --schedule auto --backend nvshmem` on one node: Iris (heap and kernels) where it measured faster here
    (auto.backend_pick says why); args then compile Iris's kernels."""
    if backend != "nvshmem":
        return backend
    from tilec.perf.auto import backend_pick
    from tilec.perf.measure import kernel_backend

    bound = _bound(args, world)
    _kernels, why = backend_pick(bound.source, world, dict(bound.dims),
                                 kernel_backend(backend, args.ranks_per_node, _option_values(args)))
    if why is None:
        return backend
    print(f"tilec run: {why}", file=sys.stderr)
    args.backend, args.ranks_per_node = "iris", None
    return "iris"


def cmd_run(args) -> int:
    from tilec.errors import ScheduleError
    from tilec.run_vs_reference import heap_bytes_for, run_program, run_program_torchrun
    from tilec.runtime import default_backend, under_torchrun

    backend = args.backend or default_backend()
    schedules = SCHEDULES if args.schedule == "all" else (args.schedule,)
    torchrun = under_torchrun()
    world = _world(args)
    if args.schedule == "auto":
        backend = _auto_backend(args, backend, world)
        schedules = (_auto_pick(args, backend, world, torchrun),)
    heap = None
    say = print
    if torchrun:  # this process is one rank: build its heap once, run every schedule in it
        from tilec.runtime import from_env

        progs = []
        for s in schedules:
            try:
                progs.append(_compile(args, s))
            except ScheduleError:
                if args.schedule != "all":
                    raise
        need = max((heap_bytes_for(p) for p in progs), default=1 << 24) * max(1, len(progs))
        heap = from_env(backend, args.heap_mb << 20 if args.heap_mb else need)
        if heap.rank != 0:
            say = lambda *a, **k: None  # noqa: E731 - rank 0 reports
    where = {"cpu": "CPU emulation (Triton interpreter)", "nvshmem": "GPU (NVSHMEM)"}.get(backend, "GPU (Iris)")
    mode = ", torchrun" if torchrun else ""
    say(f"tilec run {args.program}: world {world}, {where}{mode}, {args.repeat} call(s) per schedule"
        + _built_with(_option_values(args)), flush=True)
    failed = 0
    for s in schedules:
        t0 = time.time()
        try:
            prog = _compile(args, s)
        except ScheduleError as e:
            if args.schedule != "all":  # asked for by name: an error, as `tilec compile -s` says it (exit 2)
                raise
            say(f"  {s:<11} skipped: {e}", flush=True)
            continue
        if heap is not None:
            rows, _times = run_program_torchrun(prog, heap, repeat=args.repeat)
            if rows is None:
                continue
        else:
            rows, _times = run_program(prog, backend=backend, repeat=args.repeat,
                                       heap_bytes=args.heap_mb << 20 if args.heap_mb else None)
        worst = max(rows, key=lambda r: r.rel_err / max(r.tolerance, 1e-12))
        status = "ok" if all(r.ok for r in rows) else "MISMATCH"
        failed += status != "ok"
        say(f"  {s:<11} {status}: max error {worst.max_abs_err:.3g} (relative {worst.rel_err:.2e}, tolerance"
            f" {worst.tolerance:g}) over {len(rows)} output(s) on {world} rank(s) [{time.time() - t0:.1f}s]",
            flush=True)
        for r in rows:
            if not r.ok:
                say(f"      call {r.call + 1} rank {r.rank} {r.tensor}: max error {r.max_abs_err:.3g} (relative"
                    f" {r.rel_err:.2e})")
    if heap is not None:
        heap.close()
    return 1 if failed else 0


def cmd_bench(args) -> int:
    from tilec.perf.bench import run_bench

    schedules = args.schedules.split(",") if args.schedules else None
    options = _option_values(args)
    for s in schedules or ():
        base, plus, transport = s.partition("+")  # SCHEDULE+TRANSPORT, e.g. flags+dma
        if s != "auto" and (base not in SCHEDULES or (plus and transport not in TRANSPORTS)):
            raise TilecError(f"--schedules {s}: choose from auto, {', '.join(SCHEDULES)}, each optionally with"
                             f" +TRANSPORT ({', '.join(TRANSPORTS)}), e.g. flags+dma")
    if args.out:  # refused before an hour of timing, not after
        from tilec.fileio import ensure_dir

        ensure_dir(args.out)
    tune = True if args.tune else False if args.no_tune else None  # None: tune GEMMs, not decode
    rows = run_bench(args.program, _world(args), args.shapes, schedules, args.dtype, args.iters, tune, args.out,
                     args.backend, args.ranks_per_node, options)
    from tilec.perf.bench import not_run, wrong_rows

    missing = not_run(schedules or (), rows)
    if missing:  # named explicitly but never timed (does not apply, or no config ran): the log says why
        raise TilecError(f"--schedules: {', '.join(missing)} did not run on any shape (see the log above)")
    wrong = wrong_rows(rows, args.dtype)
    for r in wrong:
        print(f"WRONG: {r['name']} on {r['shape']}: relative error {r['rel_err']:.3g} of its outputs",
              file=sys.stderr)
    return 1 if wrong else 0


def cmd_tune(args) -> int:
    """Short timed trials of every legal schedule; `--schedule auto` then picks the fastest measured one."""
    from tilec.perf.trials import run_trials, trial_rank
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import default_backend, under_torchrun

    backend = args.backend or default_backend()
    retype = {"f16": args.dtype} if args.dtype != "f16" else None
    world, dims, options = _world(args), _dims(args.dims), _option_values(args)
    where = {"cpu": "CPU emulation (Triton interpreter: times say nothing about a GPU)",
             "nvshmem": "GPU (NVSHMEM)"}.get(backend, "GPU (Iris)")
    if under_torchrun():  # this process is one rank
        import tilec
        from tilec.runtime import from_env

        base = tilec.compile(args.program, world, "bsp", dims, granularity=args.granularity, retype=retype,
                             **options)
        heap = from_env(backend, args.heap_mb << 20 if args.heap_mb else 4 * heap_bytes_for(base))
        say = print if heap.rank == 0 else (lambda *a, **k: None)
        say(f"tilec tune {args.program}: world {world}, {where}, torchrun, {args.iters} timed calls each"
            + _built_with(options), flush=True)
        try:
            trials = trial_rank(heap, args.program, dims, args.iters, granularity=args.granularity, retype=retype,
                                log=say, ranks_per_node=args.ranks_per_node, options=options)
        finally:
            heap.close()
    else:
        say = print
        say(f"tilec tune {args.program}: world {world}, {where}, {args.iters} timed calls each" + _built_with(options),
            flush=True)
        trials = run_trials(args.program, world, dims, backend=backend, iters=args.iters,
                            granularity=args.granularity, retype=retype,
                            heap_bytes=args.heap_mb << 20 if args.heap_mb else None, ranks_per_node=args.ranks_per_node,
                            options=options)
    best = next((t for t in trials if t.measured_us is not None), None)
    for t in trials:
        if t.measured_us is None:
            say(f"  {t.schedule}: {t.note}")
    if best is None:
        raise TilecError("no schedule completed its trial")
    say(f"fastest measured: {best.schedule} ({best.measured_us:.1f} us); recorded for --schedule auto"
        " (`tilec show --schedules` lists them)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tilec", description=__doc__, epilog=EXIT_CODES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from tilec._version import __version__

    ap.add_argument("--version", action="version", version=f"tilec {__version__}", help="print the version and exit")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("compile", help="emit the Triton source of a program")
    _common(p)
    _settings(p)
    p.add_argument("-o", "--output", help="write the source here (default: stdout)")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("show", help="print the tile dataflow graph after a pass (or the source)")
    _common(p)
    _settings(p)
    p.add_argument("--after", choices=PASS_NAMES[:-1], help="the pass whose result to print (default: last)")
    p.add_argument("--source", action="store_true", help="print the generated Triton source instead")
    p.add_argument("--schedules", action="store_true", help="list the legal schedules with predicted/measured times")
    p.add_argument("--format", default="text", choices=("text", "dot", "svg", "png"),
                   help="text (default), or a picture: dot (Graphviz text), svg, png (need graphviz's `dot`)")
    p.add_argument("-o", "--output", metavar="PATH", help="write here instead of stdout (png: required)")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("check", help="static checks and verification of every schedule")
    _common(p, schedule=False)
    _settings(p)
    p.add_argument("--target", default=None, metavar="BACKEND:ARCH",
                   help="also compile every kernel for this GPU (e.g. cuda:90); needs no GPU")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("run", help="compile, run on W ranks and compare every output with the reference")
    _common(p, schedule=False)
    _settings(p, backend=False)
    p.add_argument("--schedule", "-s", default="all", choices=("all", "auto", *SCHEDULES),
                   help="all (default), auto (the model's pick; on a GPU refined by short trials), or one schedule")
    p.add_argument("--backend", choices=("cpu", "iris", "nvshmem"), default=None,
                   help="cpu: emulated ranks on the Triton interpreter; iris: GPUs (default when one is present); "
                   "nvshmem: GPUs through torch symmetric memory (kernels of backend nvshmem)")
    p.add_argument("--trials", action="store_true", help="with --schedule auto: time the candidates even on the CPU")
    p.add_argument("--repeat", type=_positive, default=2,
                   help="calls per schedule, new inputs each (flags are reused across calls; default 2)")
    p.add_argument("--heap-mb", type=_positive, default=None, help="symmetric heap size per rank")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("tune", help="time every legal schedule for a few calls; --schedule auto then picks the"
                       " fastest measured one")
    _common(p, schedule=False)
    p.add_argument("--backend", choices=("cpu", "iris", "nvshmem"), default=None,
                   help="cpu: emulated ranks on the Triton interpreter; iris: GPUs (default when one is present); "
                   "nvshmem: GPUs through torch symmetric memory (kernels of backend nvshmem, times kept apart)")
    p.add_argument("--ranks-per-node", type=_positive, default=None, metavar="N",
                   help="time backend nvshmem's kernels for nodes of N ranks (default: one node)")
    p.add_argument("--iters", type=_positive, default=5, help="timed calls per schedule (default 5)")
    _option_flags(p.add_argument_group("compile options of every schedule timed (default: the value in brackets)"))
    p.add_argument("--dtype", default="f16", choices=("f16", "bf16", "f32"), help="build the program in this dtype")
    p.add_argument("--heap-mb", type=_positive, default=None, help="symmetric heap size per rank")
    p.set_defaults(fn=cmd_tune)
    p = sub.add_parser("bench", help="time every schedule beside the external baselines (JSON + plot)")
    p.add_argument("program", help="a .tile file with dims M, N, K (e.g. examples/ag_gemm.tile)")
    p.add_argument("--world", "-w", type=int, default=None, help="ranks (default: WORLD_SIZE under torchrun, or 1)")
    p.add_argument("--shapes", default="small", help="shape sets, comma separated: paper, square, scale, decode, small"
                   " (GEMM programs); decode-paper, decode-quick, decode-small (flash decode)")
    p.add_argument("--schedules", default=None, help="comma separated (default: all); SCHEDULE+dma puts its copy"
                   " stages on the copy engines, e.g. flags+dma,fused-push+dma; auto: the variant --schedule auto"
                   " picks for each shape (a row named auto)")
    p.add_argument("--dtype", default="bf16", choices=("f16", "bf16", "f32"),
                   help="element type the program's f16 tensors are built in (default: bf16)")
    p.add_argument("--iters", type=_positive, default=20, help="timed runs per row after warm-up; the median and "
                   "p10/p90 of their device times are reported (default: 20)")
    p.add_argument("--no-tune", action="store_true", help="use the first tile config instead of tuning")
    p.add_argument("--tune", action="store_true", help="tune tile configs (the default for GEMM programs)")
    p.add_argument("--backend", default=None, metavar="BACKEND[,BACKEND]",
                   help="iris: GPUs through the Iris heap; nvshmem: GPUs through torch symmetric memory (kernels of "
                   "backend nvshmem); cpu: the CPU emulation (default: iris where a GPU is); several, comma separated"
                   " (iris,nvshmem): every schedule on each, side by side in one table, plot and JSON")
    p.add_argument("--ranks-per-node", type=_positive, default=None, metavar="N",
                   help="compile backend nvshmem's kernels for nodes of N ranks (default: one node; on --backend cpu "
                   "it runs those kernels on the CPU emulation)")
    p.add_argument("--out", default=None, help="results folder (default: benchmarks/results/<machine>)")
    _option_flags(p.add_argument_group("compile options of every schedule timed (default: the value in brackets)"))
    p.set_defaults(fn=cmd_bench)
    from tilec.cli.taxes import add_parser as add_taxes

    add_taxes(sub)
    for sp in sub.choices.values():  # `tilec CMD --help` states the rule too
        sp.epilog, sp.formatter_class = EXIT_CODES, argparse.RawDescriptionHelpFormatter
    return run_command(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
