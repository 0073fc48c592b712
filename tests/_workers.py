"""Rank functions for tilec.runtime.spawn (importable by the rank processes; never defined inside tests).

Each worker runs several pre-compiled programs, several calls each, inside one spawn: a spawn costs a process
start per rank, so tests batch everything that shares a world size into one launch.
"""

from __future__ import annotations

import sys
import time

import torch

from tilec.reference import TORCH_DTYPE


def _alloc_args(heap, prog, plain: tuple[str, ...] = ()):
    """Every argument of `prog` on the heap (in signature order, the same on every rank); names in `plain`
    (non-symmetric only) as ordinary torch tensors instead."""
    args = {}
    for name, (_kind, dtype, shape, _sym) in prog.signature().items():
        if name in plain:
            args[name] = torch.zeros(shape, dtype=TORCH_DTYPE[dtype], device=heap.device)
        else:
            args[name] = heap.alloc(shape, TORCH_DTYPE[dtype])
    return args


def _poison(args, prog) -> None:
    for n, (kind, *_r) in prog.signature().items():
        if kind == "out":
            args[n].fill_(float("nan") if args[n].dtype.is_floating_point else -1)


def run_cases(heap, cases):
    """cases: list of (key, prog, calls, plain) where calls[i][rank] is a dict of input tensors for call i.

    For every case: allocate the arguments once, then for each call copy that call's inputs into the SAME
    buffers (right after the previous call returned), poison the outputs, call, and keep a copy of the outputs.
    Returns {key: [outputs of call i]}.
    Flags are never zeroed between calls (that is what the epochs are for); the heap is released between
    cases (after a barrier, so no peer is still reading this rank's memory), so every case needs its own program
    object (a program keeps its internal buffers and flags per heap).
    """
    out = {}
    t0 = time.monotonic()
    for i, (key, prog, calls, plain) in enumerate(cases):
        if heap.rank == 0:  # where a batch stopped: pytest shows a failed test's captured stderr
            print(f"run_cases: {i + 1}/{len(cases)} {key} at {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
        mark = heap.mark()
        args = _alloc_args(heap, prog, plain)
        results = []
        for inputs in calls:
            for name, t in inputs[heap.rank].items():
                args[name].copy_(t)
            _poison(args, prog)
            try:
                ret = prog(**args)  # the active heap
            except Exception as e:  # which case of the batch failed, in the rank's traceback the host reports
                e.add_note(f"in case {key!r}, call {len(results)}")
                raise
            results.append({n: t.clone() for n, t in ret.items()})
            # no barrier here: a call ends only when no peer touches this rank's inputs/outputs any more (the
            # program adds an exit barrier where peers read them late), so the next inputs may go in right away
        out[key] = results
        heap.barrier()
        heap.release(mark)
    return out


BAD_ARGUMENTS = ("wrong shape", "wrong dtype", "missing", "unexpected", "internal buffer", "not on heap",
                 "not a tensor", "not contiguous")


def _bad_args(heap, args, case):
    b = args["B"]
    if case == "wrong shape":
        return {**args, "B": heap.alloc((b.shape[0] + 1, b.shape[1]), b.dtype)}
    if case == "wrong dtype":
        return {**args, "B": heap.alloc(tuple(b.shape), torch.float32)}
    if case == "missing":
        return {k: v for k, v in args.items() if k != "B"}
    if case == "unexpected":
        return {**args, "D": heap.alloc((4,), torch.float16)}
    if case == "internal buffer":
        return {**args, "Ag": heap.alloc((4,), torch.float16)}
    if case == "not on heap":
        return {**args, "A": args["A"].clone()}  # symmetric, but an ordinary tensor
    if case == "not a tensor":
        return {**args, "B": b.tolist()}
    if case == "not contiguous":
        return {**args, "B": heap.alloc(tuple(b.shape)[::-1], b.dtype).t()}
    raise ValueError(case)


def argument_errors(heap, prog, other_world_prog, inputs):
    """Calls `prog` with one broken argument set after another, catching each ArgumentError; then a program
    compiled for another world size; then a good call. Returns {case: error text or None, "ok": C}."""
    from tilec.errors import ArgumentError

    args = _alloc_args(heap, prog)
    for name, t in inputs.items():
        args[name].copy_(t)
    out = {}
    for case in BAD_ARGUMENTS:
        try:
            prog(**_bad_args(heap, args, case))
            out[case] = None
        except ArgumentError as e:
            out[case] = str(e)
    try:
        other_world_prog(**args)
        out["world"] = None
    except ArgumentError as e:
        out["world"] = str(e)
    ret = prog(**args)  # nothing above left the program in a bad state
    out["ok"] = ret["C"].clone()
    return out


def only_kernels(heap, bsp, flagged, inputs):
    """bsp (All-Gather + GEMM: gather, barrier, gemm) with only=(0,): the gather runs, the GEMM does not, so C keeps
    its poison; then a whole call. only= on a schedule with flags and a kernel number out of range: their errors.
    Returns {"only": C, "whole": C, "flags": text, "range": text}."""
    from tilec.errors import ArgumentError

    args = _alloc_args(heap, bsp)
    for name, t in inputs.items():
        args[name].copy_(t)
    args["C"].fill_(float("nan"))
    bsp(only=(0,), **args)
    out = {"only": args["C"].clone(), "whole": bsp(**args)["C"].clone()}
    for case, prog, only in (("flags", flagged, (0,)), ("range", bsp, (2,))):
        try:
            prog(only=only, **args)
            out[case] = None
        except ArgumentError as e:
            out[case] = str(e)
    return out


def argument_error(heap, prog, case):
    """One call with a broken argument, NOT caught: the ArgumentError reaches the parent as a RankError."""
    prog(**_bad_args(heap, _alloc_args(heap, prog), case))


def skip_call(heap, progs, calls_per_rank, inputs):
    """Rank r calls progs[r] calls_per_rank[r] times; a rank with fewer calls stands in the entry barrier of each
    call it skips (heap.barrier()), so its peers get past the barrier and then wait inside a kernel on flags it
    never releases. Returns the seconds spent in calls; a WaitTimeout propagates (a RankError in the parent)."""
    prog = progs[heap.rank]
    args = _alloc_args(heap, prog)
    for name, t in inputs[heap.rank].items():
        args[name].copy_(t)
    t0 = time.monotonic()
    for _ in range(calls_per_rank[heap.rank]):
        prog(**args)
    for _ in range(max(calls_per_rank) - calls_per_rank[heap.rank]):
        heap.barrier()
    return time.monotonic() - t0


def fresh_tensors_each_call(heap, prog, calls):
    """Like run_cases, but every call gets newly allocated arguments (the launch plan a program keeps for the
    same tensors must be rebuilt); outputs of call i are returned in order."""
    results = []
    marks = []
    for inputs in calls:
        marks.append(heap.mark())
        args = _alloc_args(heap, prog)
        for name, t in inputs[heap.rank].items():
            args[name].copy_(t)
        _poison(args, prog)
        ret = prog(**args)
        results.append({n: t.clone() for n, t in ret.items()})
    heap.barrier()
    heap.release(marks[0])
    return results
