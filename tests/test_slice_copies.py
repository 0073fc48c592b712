"""Copies written with `:` slices (`Ag[r*M/W + m, :] = A@r[m, :]`) under every schedule and transport, consumed by
tiles of another loop (a GEMM over `k`, a column-tiled sum): against torch at worlds 1, 2 and 4. Every `:` is a one-trip
loop of its own, so the store's and the load's slices were unrelated loops: local-in-place and fused-pull, reading
the copy's source in its place, dropped the sliced dim's offset (flags, fused-push and specialized were wrong, bsp
right), and the copy engines refused the copy as a reshape. Sema now gives a copy's load the store's slices."""

from __future__ import annotations

import pytest
import torch

import tilec
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.runtime import spawn

# (source, inputs per rank, the torch result per rank)
ROWS = """program rows(world W)
  dims  M = 64, K = 32, N = 32
  tiles BM = 16, BN = 32, BK = 16
  in  A  : f32[M/W, K] symmetric
  in  B  : f32[K, N]
  out C  : f32[M, N]
  buf Ag : f32[M, K] symmetric
  stage gather over r in ranks, m in M/W by BM:
    Ag[r*M/W + m, :] = A@r[m, :]
  barrier
  stage gemm over m in M by BM, n in N by BN:
    C[m, n] = sum k in K by BK: Ag[m, k] @ B[k, n]
"""
COLS = """program cols(world W)
  dims  M = 16, K = 64
  tiles BK = 16, BJ = 8
  in  A  : f32[M, K/W] symmetric
  out S  : f32[M, K]
  buf Ag : f32[M, K] symmetric
  stage gather over r in ranks, j in K/W by BJ:
    Ag[:, r*K/W + j] = A@r[:, j]
  barrier
  stage use over k in K by BK:
    S[:, k] = Ag[:, k] * 3
"""
BOTH = """program both(world W)
  dims  M = 16, K = 24
  in  A  : f32[M, K] symmetric
  out S  : f32[W*M, K]
  buf Ag : f32[W, M, K] symmetric
  tiles BM = 8
  stage gather over r in ranks:
    Ag[r, :, :] = A@r[:, :]
  barrier
  stage use over r in ranks, m in M by BM:
    S[r*M + m, :] = Ag[r, m, :] + 1
"""

# two copies in one stage: the second's slices are named after the first gave its load's up
TWO = """program two(world W)
  dims  B = 2, H = 4, D = 8
  in  X  : f32[B, H, D] symmetric
  in  L  : f32[B, H] symmetric
  out S  : f32[W*B, H, D]
  out T  : f32[W*B, H]
  buf Xg : f32[W, B, H, D]
  buf Lg : f32[W, B, H]
  stage x over r in ranks, b in B by 1:
    Xg[r, b, :, :] = X@r[b, :, :]
    Lg[r, b, :] = L@r[b, :]
  barrier
  stage y over r in ranks, b in B by 1:
    S[r*B + b, :, :] = Xg[r, b, :, :] * 2
    T[r*B + b, :] = Lg[r, b, :] + 1
"""


def _programs(world, g):
    a = [torch.randn(64 // world, 32, generator=g) for _ in range(world)]
    b = torch.randn(32, 32, generator=g)
    c = [torch.randn(16, 64 // world, generator=g) for _ in range(world)]
    d = [torch.randn(16, 24, generator=g) for _ in range(world)]
    x = [torch.randn(2, 4, 8, generator=g) for _ in range(world)]
    lv = [torch.randn(2, 4, generator=g) for _ in range(world)]
    return {
        "rows": (ROWS, [{"A": a[r], "B": b} for r in range(world)], "C", torch.cat(a) @ b),
        "cols": (COLS, [{"A": c[r]} for r in range(world)], "S", torch.cat(c, dim=1) * 3),
        "both": (BOTH, [{"A": d[r]} for r in range(world)], "S", torch.cat(d) + 1),
        "two": (TWO, [{"X": x[r], "L": lv[r]} for r in range(world)], ("S", "T"),
                (torch.cat(x) * 2, torch.cat(lv) + 1)),
    }


@pytest.mark.parametrize("world", [1, 2, 4])
def test_slice_copies_match_torch_under_every_schedule(world):
    progs = _programs(world, torch.Generator().manual_seed(world))
    cases, want = [], {}
    for name, (src, inputs, out, ref) in progs.items():
        for sched in SCHEDULES:
            for transport in ("sm", "dma"):
                try:
                    prog = tilec.compile(f"{name}.tile", source=src, world=world, schedule=sched,
                                         transport=transport)
                except ScheduleError as e:  # `both`, `two` copy a tile into a box of one more (unit) dim: a reshape
                    assert "reshapes the tile" not in str(e) or name in ("both", "two"), (name, sched, transport, e)
                    continue
                cases.append(((name, sched, transport), prog, [inputs] * 2, ()))
                want[(name, sched, transport)] = (out, ref)
    ran = {(n, t) for n, _s, t in want}
    assert {("rows", "dma"), ("cols", "dma"), ("rows", "sm")} <= ran or world == 1, ran
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 22, timeout=300)
    for rank, res in enumerate(got):
        for key, outs in res.items():
            out, ref = want[key]
            names, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
            for o in outs:
                for name, r in zip(names, refs, strict=True):
                    assert float((o[name] - r).abs().max()) < 1e-4, (rank, key, name)
