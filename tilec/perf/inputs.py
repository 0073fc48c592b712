"""Inputs for timed calls: random tensors on the heap, and a flash-decode program's Q, K, V and lengths."""

from __future__ import annotations

import torch

from tilec.errors import TilecError
from tilec.reference import TORCH_DTYPE

DECODE_DIMS = ("B", "HKV", "G", "D", "S")


def make_inputs(dims: dict, world: int, rank: int, dtype: str, device, seed: int = 0, layout: str = "bshd"):
    """Q and lens are the same on every rank; K and V are this rank's block of the cache, [B, S, HKV, D]
    (layout "bshd") or [B, HKV, S, D] ("bhsd": the same values, stored head-major). Generated on the device (GiBs
    of KV: a CPU generator would take minutes)."""

    dt = TORCH_DTYPE[dtype]
    b, hkv, g, d, s = (dims[k] for k in DECODE_DIMS)
    shared = torch.Generator(device=device).manual_seed(seed)
    mine = torch.Generator(device=device).manual_seed(seed + 1000 + rank)
    q = torch.randn((b, hkv * g, d), generator=shared, device=device, dtype=dt)
    k = torch.randn((b, s, hkv, d), generator=mine, device=device, dtype=dt)
    v = torch.randn((b, s, hkv, d), generator=mine, device=device, dtype=dt)
    lens = torch.full((b,), world * s, dtype=torch.int32, device=device)
    if layout == "bhsd":  # one at a time: at 1M positions each is GiBs
        k = k.transpose(1, 2).contiguous()
        v = v.transpose(1, 2).contiguous()
    return q, k, v, lens


def kv_layout(k_shape, dims: dict) -> str:
    """"bshd" for K [B, S, HKV, D] (position-major), "bhsd" for K [B, HKV, S, D] (head-major)."""
    b, hkv, d, s = dims["B"], dims["HKV"], dims["D"], dims["S"]
    if hkv == s:
        raise TilecError(f"HKV = S = {s}: the decode bench cannot tell K's layout from its shape; use another S")
    if tuple(k_shape) == (b, s, hkv, d):
        return "bshd"
    if tuple(k_shape) == (b, hkv, s, d):
        return "bhsd"
    raise TilecError(f"K {list(k_shape)}: the decode bench takes K and V as [B, S, HKV, D] or [B, HKV, S, D]")


def kv_room(dims: dict) -> int:
    """Positions a rank's K and V blocks have room for: S, or NS * L where the split count is a dim of the program
    (examples/flash_decode_splits.tile)."""
    return dims["NS"] * dims["L"] if {"NS", "L"} <= set(dims) else dims["S"]


def with_room(x: torch.Tensor, layout: str, room: int) -> torch.Tensor:
    """A rank's K or V block (S positions) in a block with room for `room` >= S positions, the rest zero: what a
    free-split program takes (its rows past S are never read). The tensor itself where room == S."""
    dim = 2 if layout == "bhsd" else 1
    if x.shape[dim] == room:
        return x
    if room < x.shape[dim]:
        raise TilecError(f"K and V blocks with room for {room} positions (NS*L) cannot hold the S = {x.shape[dim]} "
                         "positions of a rank: give NS*L >= S")
    shape = list(x.shape)
    shape[dim] = room
    out = torch.zeros(shape, dtype=x.dtype, device=x.device)
    out.narrow(dim, 0, x.shape[dim]).copy_(x)
    return out


def bench_inputs(prog, heap, seed: int):
    """Every tensor of a call, on the heap: random inputs (a flash-decode program gets the decode bench's Q, K,
    V and full lengths: random integers would be meaningless lengths), zeroed outputs."""

    sig = prog.signature()
    decode = {}
    if all(d in prog.dims for d in DECODE_DIMS) and {"Q", "K", "V", "lens"} <= set(sig):
        d, room = prog.dims, kv_room(prog.dims)
        try:
            layout = kv_layout(sig["K"][2], {**d, "S": room})
        except TilecError:  # not the decode bench's tensors after all: random inputs like any program
            layout = None
        if layout:
            q, k, v, lens = make_inputs(d, prog.world, heap.rank, sig["Q"][1], heap.device, seed, layout)
            decode = {"Q": q, "K": with_room(k, layout, room), "V": with_room(v, layout, room), "lens": lens}
    args = {}
    g = torch.Generator(device="cpu").manual_seed(seed + heap.rank)
    for name, (kind, dtype, shape, _sym) in sig.items():
        t = heap.alloc(shape, TORCH_DTYPE[dtype], zero=kind != "in")
        if name in decode:
            t.copy_(decode[name])
        elif kind == "in":
            t.copy_((torch.randn(shape, generator=g) / 8).to(t.dtype))
        args[name] = t
    return args


def gemm_inputs(pattern: str, dims: dict, world: int, rank: int, dtype: str, device) -> tuple[torch.Tensor, ...]:
    """Rank `rank`'s A and B of a GEMM-family shape as the program declares them (ag: A [M/W, K] and the same
    B [K, N] on every rank; rs / ar: A [M, K/W], B [K/W, N]), seeded by rank so any rank can make any rank's."""
    m, n, k = dims["M"], dims["N"], dims["K"]
    a_shape, b_shape = ((m // world, k), (k, n)) if pattern == "ag" else ((m, k // world), (k // world, n))
    ga = torch.Generator(device=device).manual_seed(1000 + rank)
    gb = torch.Generator(device=device).manual_seed(2000 + (0 if pattern == "ag" else rank))
    dt = TORCH_DTYPE[dtype]
    a = (torch.randn(a_shape, generator=ga, device=device, dtype=torch.float32) / 8).to(dt)
    b = (torch.randn(b_shape, generator=gb, device=device, dtype=torch.float32) / 8).to(dt)
    return a, b


GEMM_REF_LIMIT = 1 << 31  # multiply-adds up to which a rank recomputes the whole op in f32 as the reference (CPU)


def gemm_reference(pattern: str, dims: dict, world: int, rank: int, dtype: str, device) -> torch.Tensor | None:
    """This rank's C computed from every rank's inputs (independent of any baseline and of the ranks' links): in f32,
    or on a GPU above GEMM_REF_LIMIT by torch's matmul in the inputs' dtype (f32 accumulation, each product
    returned as f32: a paper shape takes milliseconds there), so that rows with no baseline beside them (ranks
    sharing a GPU under MPS) are still checked; None on the CPU when the problem is too large to recompute."""
    m, n, k = dims["M"], dims["N"], dims["K"]
    exact = m * n * k <= GEMM_REF_LIMIT
    if not exact and torch.device(device).type == "cpu":
        return None
    ins = [gemm_inputs(pattern, dims, world, r, dtype, device) for r in range(world)]

    def up(t):
        return t.float() if exact else t

    if pattern == "ag":
        return (torch.cat([up(a) for a, _ in ins]) @ up(ins[0][1])).float()
    full = sum((up(a) @ up(b)).float() for a, b in ins)
    return full[rank * (m // world):(rank + 1) * (m // world)] if pattern == "rs" else full
