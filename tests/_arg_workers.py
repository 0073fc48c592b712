"""Rank functions of tests/test_arguments.py (importable by rank processes): a grid of argument mutations, each
tried on a program that has already run, and heap releases under a program's internal buffers."""

from __future__ import annotations

import torch

from tilec.errors import ArgumentError

# every form of a broken argument the grid builds; (name, form) pairs run for each argument of the program
FORMS = ("dtype", "shape", "transposed", "strided in place", "offset in place", "not a tensor", "meta device",
         "overlaps output", "output overlaps", "in internal buffers", "off heap")


def _arena_view(heap, like: torch.Tensor, offset: int) -> torch.Tensor:
    """A contiguous tensor shaped like `like` at byte `offset` of this rank's heap (any offset: aliasing on
    purpose)."""
    elems = heap._arena.view(like.dtype)
    return elems.as_strided(like.shape, like.stride(), offset // like.element_size())


def _broken(heap, prog, args: dict, name: str, form: str, internal: tuple[int, int]):
    """`args` with argument `name` broken in `form`, or None where the form does not exist for it. Forms "in place"
    mutate the very tensor object that was passed before (the case a cache on pointer/shape/dtype missed)."""
    t = args[name]
    kind, _dtype, shape, sym = prog.signature()[name]
    outs = [n for n, (k, *_r) in prog.signature().items() if k == "out" and n != name]
    others = [n for n in args if n != name]
    if form == "dtype":
        return {**args, name: heap.alloc(shape, torch.float32)}
    if form == "shape":
        return {**args, name: heap.alloc((shape[0] + 1, *shape[1:]), t.dtype)}
    if form == "transposed":
        return {**args, name: heap.alloc(shape[::-1], t.dtype).t()}
    if form == "strided in place":  # same pointer and shape, strides of the transpose
        t.as_strided_(shape, (1, shape[0]))
        return args
    if form == "offset in place":  # the same tensor object moved (set_) onto an output's (an input's) first bytes
        ins = [n for n in others if n not in outs]
        other = args[outs[0] if kind != "out" and outs else ins[0]]
        off = heap.offset_of(other) // t.element_size()
        t.set_(t.untyped_storage(), off, shape, t.stride())
        return args
    if form == "not a tensor":
        return {**args, name: t.tolist()}
    if form == "meta device":
        return {**args, name: torch.empty(shape, dtype=t.dtype, device="meta")}
    if form == "overlaps output":  # this argument shares its last bytes with an output's first ones
        if not outs:
            return None
        out = args[outs[0]]
        start = heap.offset_of(out) + out.element_size() * 8 - t.numel() * t.element_size()
        if start < 0:
            return None
        return {**args, name: _arena_view(heap, t, start)}
    if form == "output overlaps":  # an output placed over half of this argument
        if not outs:
            return None
        out = args[outs[0]]
        return {**args, outs[0]: _arena_view(heap, out, heap.offset_of(t) + t.numel() * t.element_size() // 2)}
    if form == "in internal buffers":
        return {**args, name: _arena_view(heap, t, internal[0])}
    if form == "off heap":  # symmetric: must be on the heap; others may be ordinary tensors (then valid)
        return {**args, name: t.clone()} if sym else None
    raise ValueError(form)


def argument_grid(heap, prog, calls):
    """calls[i][rank]: inputs of call i. First a good call; then every (argument, form) broken on its own, the
    ArgumentError text kept, each followed by a good call with the next new inputs on freshly allocated tensors.
    Returns {"errors": {(name, form): text or None}, "good": [(inputs, outputs) of every good call]}."""
    args = _fresh(heap, prog)
    before = heap.mark()
    good = [_good_call(heap, prog, args, calls[0])]
    internal = (before, heap.mark())  # the program allocated its buffers and flags at its first call
    errors = {}
    i = 1
    for name in prog.signature():
        for form in FORMS:
            broken = _broken(heap, prog, args, name, form, internal)
            if broken is None:
                continue
            try:
                prog(**broken)
                errors[(name, form)] = None
            except ArgumentError as e:
                errors[(name, form)] = str(e)
            args = _fresh(heap, prog)  # the mutated tensors are left broken; new ones for the next call
            good.append(_good_call(heap, prog, args, calls[i % len(calls)]))
            i += 1
    return {"errors": errors, "good": good}


def valid_forms(heap, prog, calls):
    """Arguments that differ from the last call but are valid must be re-checked and give the right result: a
    non-symmetric argument as an ordinary tensor, a tensor moved in place (set_) onto a free heap region, strides
    changed and changed back. Returns [(inputs, outputs)] of every call."""
    args = _fresh(heap, prog)
    res = [_good_call(heap, prog, args, calls[0])]
    plain = [n for n, (_k, _d, _s, sym) in prog.signature().items() if not sym]
    args = {**args, **{n: args[n].clone() for n in plain}}
    res.append(_good_call(heap, prog, args, calls[1]))
    for t in args.values():  # every tensor moved in place onto new heap memory
        spare = heap.alloc(t.shape, t.dtype)
        t.set_(spare.untyped_storage(), spare.storage_offset(), t.shape, t.stride())
    res.append(_good_call(heap, prog, args, calls[2]))
    for t in args.values():
        shape, stride = t.shape, t.stride()
        t.as_strided_(shape, (1, shape[0]))
        t.as_strided_(shape, stride)
    res.append(_good_call(heap, prog, args, calls[3]))
    return res


def release_and_reallocate(heap, prog, calls, filler: float):
    """A call; then heap.release() below the program's internal buffers and new allocations over them (filled
    with `filler`, as user data would be); then more calls, each with new inputs. Returns [(inputs, outputs)]."""
    mark = heap.mark()
    res = [_good_call(heap, prog, _fresh(heap, prog), calls[0])]
    used = heap.mark()
    heap.release(mark)
    heap.alloc((used - mark + 4096,), torch.uint8).fill_(int(filler) & 0xFF)  # over the old buffers and flags
    args = _fresh(heap, prog)
    for inputs in calls[1:]:
        res.append(_good_call(heap, prog, args, inputs))
    heap.release(mark)  # and once more without reallocating first: the next call makes its own again
    res.append(_good_call(heap, prog, _fresh(heap, prog), calls[0]))
    return res


def _fresh(heap, prog):
    return {n: heap.alloc(shape, _dtype(dtype)) for n, (_k, dtype, shape, _s) in prog.signature().items()}


def _dtype(name):
    from tilec.reference import TORCH_DTYPE

    return TORCH_DTYPE[name]


def _good_call(heap, prog, args, inputs_per_rank):
    inputs = inputs_per_rank[heap.rank]
    for n, (kind, *_r) in prog.signature().items():
        if kind == "in":
            args[n].copy_(inputs[n])
        elif kind == "out":
            args[n].fill_(float("nan"))
    out = prog(**args)
    return inputs, {n: t.clone() for n, t in out.items()}
