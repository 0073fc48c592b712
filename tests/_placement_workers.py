"""Rank functions of tests/test_symmetric_placement.py (importable by the rank processes)."""

from __future__ import annotations

import torch

from tilec.errors import ArgumentError
from tilec.reference import TORCH_DTYPE


def _args(heap, prog, pad_first_on: int | None):
    """The arguments of `prog` on the heap, with a 1 KiB pad allocated before them on rank `pad_first_on` and after
    them on the others: the same heap use everywhere, other offsets on that rank."""
    if heap.rank == pad_first_on:
        heap.alloc((256,), torch.float32)
    args = {n: heap.alloc(shape, TORCH_DTYPE[dt]) for n, (_k, dt, shape, _s) in prog.signature().items()}
    if pad_first_on is not None and heap.rank != pad_first_on:
        heap.alloc((256,), torch.float32)
    return args


def _call(prog, args, inputs) -> str | torch.Tensor:
    for n, t in inputs.items():
        args[n].copy_(t)
    args["C"].fill_(float("nan"))
    try:
        prog(**args)
    except ArgumentError as e:
        return str(e)
    return args["C"].clone()


def placements(heap, prog, fresh, inputs):
    """shifted: A at another offset on rank 1; fixed: then the same call with A allocated anew at one offset on
    every rank (the same heap, the same program: its flags' epochs must still be in step); internal: another
    program's first call after rank 2 allocated more than the others (its internal buffers differ)."""
    mine = inputs[heap.rank]
    args = _args(heap, prog, pad_first_on=1)
    out = {"shifted": _call(prog, args, mine)}
    args["A"] = heap.alloc(tuple(args["A"].shape), args["A"].dtype)
    out["fixed"] = _call(prog, args, mine)
    out["again"] = _call(prog, args, mine)
    args = _args(heap, fresh, pad_first_on=None)
    if heap.rank == 2:
        heap.alloc((256,), torch.float32)
    out["internal"] = _call(fresh, args, mine)
    return out
