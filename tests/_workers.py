"""Rank functions for tilec.runtime.spawn (importable by the rank processes; never defined inside tests).

Each worker runs several pre-compiled programs, several calls each, inside one spawn: a spawn costs a process
start per rank, so tests batch everything that shares a world size into one launch.
"""

from __future__ import annotations

import time

import torch

from tilec.reference import TORCH_DTYPE


def _alloc_args(heap, prog, plain: tuple[str, ...] = ()):
    """Every argument of `prog` on the heap (in signature order, the same on every rank); names in `plain`
    (non-symmetric only) as ordinary torch tensors instead."""
    args = {}
    for name, (_kind, dtype, shape, _sym) in prog.signature().items():
        if name in plain:
            args[name] = torch.zeros(shape, dtype=TORCH_DTYPE[dtype])
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
    buffers, poison the outputs, call, and keep a copy of the outputs. Returns {key: [outputs of call i]}.
    Flags are never zeroed between calls (that is what the epochs are for); the heap is released between
    cases (after a barrier, so no peer is still reading this rank's memory).
    """
    out = {}
    for key, prog, calls, plain in cases:
        mark = heap.mark()
        args = _alloc_args(heap, prog, plain)
        results = []
        for inputs in calls:
            for name, t in inputs[heap.rank].items():
                args[name].copy_(t)
            _poison(args, prog)
            ret = prog(**args)  # the active heap
            results.append({n: t.clone() for n, t in ret.items()})
            heap.barrier()  # peers may still read this rank's inputs; change them only after everyone is done
        out[key] = results
        prog._state.clear()  # its internal buffers live in the region released below
        heap.barrier()
        heap.release(mark)
    return out


def argument_errors(heap, prog, inputs):
    """Calls `prog` with one broken argument set after another; returns {case: error text or None}."""
    from tilec.errors import ArgumentError

    args = _alloc_args(heap, prog)
    for name, t in inputs.items():
        args[name].copy_(t)
    shapes = {n: s for n, (_k, _d, s, _y) in prog.signature().items()}
    cases = {
        "wrong shape": {**args, "B": heap.alloc((shapes["B"][0] + 1, shapes["B"][1]), args["B"].dtype)},
        "wrong dtype": {**args, "B": heap.alloc(shapes["B"], torch.float32)},
        "missing": {k: v for k, v in args.items() if k != "B"},
        "unexpected": {**args, "D": heap.alloc((4,), torch.float16)},
        "internal buffer": {**args, "Ag": heap.alloc((4,), torch.float16)},
        "not on heap": {**args, "A": args["A"].clone()},
        "not a tensor": {**args, "B": args["B"].tolist()},
        "not contiguous": {**args, "B": heap.alloc(shapes["B"][::-1], args["B"].dtype).t()},
    }
    out = {}
    for case, kw in cases.items():
        try:
            prog(**kw)
            out[case] = None
        except ArgumentError as e:
            out[case] = f"ArgumentError: {e}"
    # the good call still works after all that, and its result is right
    ret = prog(**args)
    out["ok"] = ret["C"].clone()
    return out


def argument_error_raise(heap, prog, inputs):
    """A call with a wrong-shape argument, NOT caught: the ArgumentError must reach the parent as a RankError."""
    args = _alloc_args(heap, prog)
    args["B"] = heap.alloc((1, 1), args["B"].dtype)
    prog(**args)


def skip_call(heap, progs, calls_per_rank, inputs):
    """Rank r calls progs[r] calls_per_rank[r] times (a mismatch: some waits can never be satisfied).
    Returns the time this rank spent in calls; a WaitTimeout propagates (as a RankError in the parent)."""
    prog = progs[heap.rank]
    args = _alloc_args(heap, prog)
    for name, t in inputs[heap.rank].items():
        args[name].copy_(t)
    t0 = time.monotonic()
    for _ in range(calls_per_rank[heap.rank]):
        prog(**args)
    return time.monotonic() - t0


def wait_timeout_kernel(heap, progs, inputs, entry_barrier: bool):
    """Rank r runs progs[r] once. Used with a consumer program on one rank whose producer (on the other rank)
    is a program object that never releases the flags the consumer waits on."""
    prog = progs[heap.rank]
    args = _alloc_args(heap, prog)
    for name, t in inputs[heap.rank].items():
        args[name].copy_(t)
    t0 = time.monotonic()
    try:
        prog(**args)
    finally:
        elapsed = time.monotonic() - t0
    return elapsed
