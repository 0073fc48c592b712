"""Rank-side code of the flash-decode tests (importable by spawned rank processes)."""

from __future__ import annotations

import math

import torch

from tests._workers import _alloc_args
from tilec.reference import TORCH_DTYPE


def attention_reference(q, ks, vs, lens, groups):
    """Plain softmax attention of each sequence over its whole cache (the rank blocks concatenated)."""
    k, v = torch.cat(ks, 1).float(), torch.cat(vs, 1).float()
    b_n, h_n, d = q.shape
    out = torch.zeros(b_n, h_n, d)
    for b in range(b_n):
        n = int(lens[b])
        for h in range(h_n):
            if n:
                s = k[b, :n, h // groups] @ q[b, h].float() / math.sqrt(d)
                out[b, h] = torch.softmax(s, 0) @ v[b, :n, h // groups]
    return out


def make_case(world: int, dims: dict, dtype: str, seed: int, poison: bool = True):
    g = torch.Generator().manual_seed(seed)
    dt = TORCH_DTYPE[dtype]
    b, hkv, grp, d, s = dims["B"], dims["HKV"], dims["G"], dims["D"], dims["S"]
    q = torch.randn(b, hkv * grp, d, generator=g).to(dt)
    ks = [torch.randn(b, s, hkv, d, generator=g).to(dt) for _ in range(world)]
    vs = [torch.randn(b, s, hkv, d, generator=g).to(dt) for _ in range(world)]
    # lengths that are not multiples of the split size, one ending inside rank 0's block (empty shards after it),
    # one empty sequence when the batch allows, the rest anywhere up to the full cache
    lens = torch.randint(1, world * s + 1, (b,), generator=g, dtype=torch.int32)
    lens[0] = min(s // 3 + 1, world * s)
    if b > 2:
        lens[1] = 0
    # poison: cache slots past a sequence's end hold NaN (an unwritten cache may hold anything): no key or value
    # there may reach the result, neither through a masked score nor as 0 * NaN in P.V
    for r in range(world if poison else 0):
        for i in range(b):
            ks[r][i, max(0, int(lens[i]) - r * s):] = float("nan")
            vs[r][i, max(0, int(lens[i]) - r * s):] = float("nan")
    return q, ks, vs, lens


def as_declared(kv, shape):
    """A [B, S, HKV, D] block of the cache in the program's layout: as is, or head-major [B, HKV, S, D]; a block
    with room for more positions (examples/flash_decode_splits.tile: NS*L >= S) holds NaN past S, which no split
    may read."""
    b, s, hkv, d = kv.shape
    if tuple(shape) in ((b, s, hkv, d), (b, hkv, s, d)):
        return kv if tuple(kv.shape) == tuple(shape) else kv.transpose(1, 2)
    head_major = tuple(shape[:2]) == (b, hkv) and shape[2] != hkv
    room = torch.full(shape, float("nan"), dtype=kv.dtype)
    (room[:, :, :s] if head_major else room[:, :s]).copy_(kv.transpose(1, 2) if head_major else kv)
    return room


def run_cases(heap, cases, calls: int = 2):
    """cases: [(CompiledProgram, dtype, seed)]. Each is called `calls` times with fresh inputs; returns the max
    error against attention_reference per call."""
    out = []
    for prog, dtype, seed in cases:
        mark = heap.mark()
        args = _alloc_args(heap, prog)
        errs = []
        for call in range(calls):
            want = _fill(heap, prog, args, dtype, seed + call)
            prog(heap, **args)
            errs.append(float((args["O"].float().cpu() - want).abs().max()))
        in_step = counters_in_step(heap, prog)  # before the release: the program's counters sit above the mark
        heap.release(mark)
        out.append((prog.schedule, dtype, prog.dims, errs, in_step))
    return out


def counters_in_step(heap, prog) -> bool:
    """After a synchronous call, every flag counter of this rank has been bumped exactly its count per call so far
    (the epoch arithmetic every wait relies on)."""
    st = prog._state[id(heap)]
    flags = prog.module.FLAGS.items()
    return all(bool((st["bufs"][p] == st["epoch"] * count).all()) for p, (_size, count, *_r) in flags)


def _fill(heap, prog, args, dtype, seed):
    """Writes one case's Q, this rank's K/V block and lens into args, poisons O; returns the reference O."""
    q, ks, vs, lens = make_case(heap.world, prog.dims, dtype, seed)
    args["Q"].copy_(q)
    args["K"].copy_(as_declared(ks[heap.rank], args["K"].shape))
    args["V"].copy_(as_declared(vs[heap.rank], args["V"].shape))
    args["lens"].copy_(lens)
    args["O"].fill_(float("nan"))
    return attention_reference(q, ks, vs, lens, prog.dims["G"])


def captured_cases(heap, cases, replays: int = 3):
    """cases: [(CompiledProgram, dtype, seed)]. Each is captured twice as a CUDA graph on one set of tensors, then
    the two are replayed in turn on new inputs written into the tensors (one replay asynchronous), with an ordinary
    call in the middle. Returns per case the max error against attention_reference of every call after the
    captures, and whether afterwards the device epoch equals the number of calls and every flag counter was
    bumped exactly its count per call (a replay with a stale epoch would break both)."""
    out = []
    for prog, dtype, seed in cases:
        mark = heap.mark()
        args = _alloc_args(heap, prog)
        _fill(heap, prog, args, dtype, seed)
        calls = [prog.capture(heap, **args), prog.capture(heap, **args)]
        errs = []
        for i in range(replays * 2 + 1):
            want = _fill(heap, prog, args, dtype, seed + 1 + i)
            if i == replays:
                prog(heap, **args)  # an ordinary call: the device epoch of the next replay must catch up
            elif i == 1:
                calls[1].replay(sync=False)
                torch.cuda.synchronize()
            else:
                calls[i % 2].replay()
            errs.append(float((args["O"].float().cpu() - want).abs().max()))
        st = prog._state[id(heap)]
        in_step = int(st["bufs"]["EPOCH"][0].item()) == st["epoch"] and counters_in_step(heap, prog)
        heap.release(mark)
        out.append((prog.schedule, dtype, prog.dims, errs, in_step))
    return out


def capture_errors(heap, progs):
    """The ArgumentError text of capturing each program (None when it captured)."""
    from tilec.errors import ArgumentError

    out = []
    for prog in progs:
        args = _alloc_args(heap, prog)
        try:
            prog.capture(heap, **args)
            out.append(None)
        except ArgumentError as e:
            out.append(str(e))
    return out
