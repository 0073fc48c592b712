"""`tilec.compile`: .tile program -> verified graph -> Triton source, as one call."""

from __future__ import annotations

import dataclasses
import os

from tilec import settings
from tilec.codegen.emit import build_model
from tilec.codegen.render import render
from tilec.errors import ArgumentError, CompileError, ScheduleError
from tilec.frontend.limits import tile_problems
from tilec.frontend.parser import parse, parse_file
from tilec.frontend.sema import check, check_arguments
from tilec.passes.base import run_pipeline
from tilec.passes.lower import Lower, program_graph
from tilec.passes.schedules import SCHEDULES, pipeline
from tilec.passes.transport import parse_transport, wants_dma
from tilec.passes.verify import verify
from tilec.passes.verify.nodes import check_placement
from tilec.program import CompiledProgram


def compile(  # noqa: A001 - the public name the docs promise
    program: str | os.PathLike,
    world: int = 1,
    schedule: str = "bsp",
    dims: dict[str, int] | None = None,
    *,
    granularity: str = "auto",
    group_m: int = 8,
    num_warps: int = 4,
    num_stages: int = 3,
    retype: dict[str, str] | None = None,
    start_local: bool | None = None,
    wait_timeout: float | None = None,
    source: str | None = None,
    timeline: bool = False,
    noinline_tasks: bool = False,
    attend_block: int = 64,
    transport: str = "sm",
    fold: bool | None = None,
    pdl: bool | None = None,
    wait_sleep_ns: int | None = None,
    programs_per_sm: int | None = None,
    dma_streams: int | None = None,
    claim: str | None = None,
    backend: str | None = None,
    ranks_per_node: int | None = None,
) -> CompiledProgram:
    """Compile a .tile program (a path, or `source=` text) for `world` ranks with the given schedule.

    dims: values for the program's dims and tile sizes (like -D on the command line).
    retype: map declared dtypes to others, e.g. {"f16": "bf16"} to build the same program in bf16.
    num_warps, num_stages, group_m: launch and tile-order settings of the generated kernels (the tuner's knobs).
    start_local: each rank starts every stage's tasks at its own share (its rows, its shard) instead of task 0
    (default: only with transport=dma, whose copy engines deliver this rank's own rows first).
    timeline: a debug build whose tasks record when they started, finished waiting and ended (prog.timeline()).
    noinline_tasks: a merged kernel calls each stage's task function instead of inlining it, so registers are not
    shared across stages (the persistent flash decode compiles to 128 registers instead of 255 for sm_90).
    wait_timeout: seconds of wall-clock time one flag wait may spin before the call raises WaitTimeout (60).
    fold: fused-push and specialized end with the fold-last pass (True).
    pdl: a call's kernels that run one after another are programmatic dependent launches on sm_90+ (True).
    wait_sleep_ns: nanoseconds a spinning flag wait sleeps between polls on a GPU (0).
    programs_per_sm: the most programs of a persistent kernel resident per SM (2; fewer where they do not fit).
    dma_streams: side streams the copy engines' chunks go out on (4).
    claim: persistent loops take their tasks from a counter, in task order: auto (under MPS, where a rank's
    programs may not all be resident), on or off.
    Each of these seven left None takes the default in brackets (tilec/settings.py, OPTIONS; no environment variable
    sets them); the values used are recorded in the module's header (prog.options).
    backend: how kernels reach peers: "iris" (default: Iris's heap, every peer by pointer) or "nvshmem" (torch
    symmetric memory; peers off this rank's node by NVSHMEM puts, gets and signals, docs/SCALE.md).
    ranks_per_node: ranks of one node, which reach each other by pointer (default: the world, one node); it must
    divide the world and needs backend "nvshmem" where it is smaller. The header records these two where they are
    not the defaults.
    attend_block: keys per step of a streamed attend (a power of two >= 16; each step loads that many rows of k
    and v, pipelined num_stages deep).
    transport: who moves the tiles of copy stages: sm (tasks on the SMs), dma (the copy engines, for schedules with
    flags: a side stream copies chunk by chunk and releases each chunk's flag), auto (sm here: the
    compiler sits below the cost model; tilec.perf.auto.compile_auto picks sm or dma per shape), or per stage:
    "gather=dma" (stages not named stay on the SMs).
    Raises CompileError (bad program), ScheduleError (schedule does not apply, with the reason) or VerifyError.
    """
    if num_warps < 1 or num_warps & (num_warps - 1):
        raise ArgumentError(f"num_warps={num_warps}: must be a power of two (Triton's warps per program)")
    if num_stages < 1:
        raise ArgumentError(f"num_stages={num_stages}: must be >= 1")
    if attend_block < 16 or attend_block & (attend_block - 1):
        raise ArgumentError(f"attend_block={attend_block}: must be a power of two >= 16 (tl.dot's smallest tile)")
    try:
        parse_transport(transport)
    except ValueError as e:
        raise ArgumentError(str(e)) from None
    opts = settings.options(fold=fold, pdl=pdl, wait_sleep_ns=wait_sleep_ns, programs_per_sm=programs_per_sm,
                            dma_streams=dma_streams, wait_timeout=wait_timeout, claim=claim, backend=backend,
                            ranks_per_node=ranks_per_node)
    world, dims = check_arguments(world, dims)  # before the program is read: a bad argument is named first
    opts = check_placement(opts, world, transport)
    if schedule == "auto":  # the compiler sits below the cost model: the pick is the perf layer's
        raise ScheduleError("schedule 'auto' is chosen by the cost model: call tilec.perf.auto.compile_auto(...) "
                            f"(or `tilec compile --schedule auto`), or name one of {', '.join(SCHEDULES)}")
    if schedule not in SCHEDULES:
        raise ScheduleError(f"unknown schedule '{schedule}' (choose from {', '.join(SCHEDULES)})")
    ast = parse(source, str(program)) if source is not None else parse_file(program)
    if retype:
        ast = _retype(ast, retype)
    bound = check(ast, world, dims)
    too_big = tile_problems(bound.items, num_stages)  # shared memory of the pipelined loops num_stages makes
    if too_big:
        raise CompileError(too_big, bound.source)
    snaps: dict = {}
    g0 = program_graph(bound)
    g0.graph["ranks_per_node"] = opts.ranks_per_node or world
    g = run_pipeline(g0, [Lower(), *pipeline(schedule, granularity, transport=transport,
                                                                fold=opts.fold)], verify, snaps)
    model = build_model(g, schedule, {"group_m": group_m, "num_warps": num_warps, "num_stages": num_stages,
                                      "start_local": wants_dma(transport) if start_local is None else start_local,
                                      "timeline": timeline,
                                      "noinline_tasks": noinline_tasks, "attend_block": attend_block,
                                      "backend": opts.backend, "ranks_per_node": opts.ranks_per_node or world})
    # the options that change what is compiled or how it launches: written into the module (its cache key)
    line = opts.line()
    if len(line) > 118:  # backend and ranks_per_node on a line of their own
        at = line.index(" backend=")
        line = (line[:at], " " * len("settings:") + line[at:])
    model = dataclasses.replace(model, header=(*model.header, *((line,) if isinstance(line, str) else line)),
                                wait_sleep_ns=opts.wait_sleep_ns)
    src = render(model)
    prog = CompiledProgram(bound, schedule, src, g, snaps, opts.wait_timeout, options=opts)
    return prog


def _retype(ast, mapping: dict[str, str]):
    from dataclasses import replace

    from tilec.errors import TilecError
    from tilec.ir.dtypes import DTYPES

    for k, v in mapping.items():
        if k not in DTYPES or v not in DTYPES:
            raise TilecError(f"retype {k}->{v}: dtypes are {', '.join(DTYPES)}")
    return replace(ast, tensors=tuple(replace(t, dtype=mapping.get(t.dtype, t.dtype)) for t in ast.tensors))
