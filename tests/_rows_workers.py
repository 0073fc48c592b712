"""Rank function of tests/test_rows.py (importable by the rank processes): calls that may raise IndexRangeError."""

from __future__ import annotations

from tests._workers import _alloc_args, _poison
from tilec.errors import IndexRangeError


def calls_or_errors(heap, cases):
    """cases: (key, prog, calls) with calls[i][rank] the inputs of call i. Returns {key: [outputs of call i, or the
    IndexRangeError's message]}; a call after an error runs on the same buffers (the error word was cleared)."""
    out = {}
    for key, prog, calls in cases:
        mark = heap.mark()
        args = _alloc_args(heap, prog)
        results = []
        for inputs in calls:
            for name, t in inputs[heap.rank].items():
                args[name].copy_(t)
            _poison(args, prog)
            try:
                ret = prog(**args)
            except IndexRangeError as e:
                results.append(str(e))
                continue
            results.append({n: t.clone() for n, t in ret.items()})
        out[key] = results
        heap.barrier()
        heap.release(mark)
    return out
