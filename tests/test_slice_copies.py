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


def _programs(world, g):
    a = [torch.randn(64 // world, 32, generator=g) for _ in range(world)]
    b = torch.randn(32, 32, generator=g)
    c = [torch.randn(16, 64 // world, generator=g) for _ in range(world)]
    d = [torch.randn(16, 24, generator=g) for _ in range(world)]
    return {
        "rows": (ROWS, [{"A": a[r], "B": b} for r in range(world)], "C", torch.cat(a) @ b),
        "cols": (COLS, [{"A": c[r]} for r in range(world)], "S", torch.cat(c, dim=1) * 3),
        "both": (BOTH, [{"A": d[r]} for r in range(world)], "S", torch.cat(d) + 1),
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
                except ScheduleError as e:  # `both` copies a [16, 24] tile into a [1, 16, 24] box: a reshape
                    assert "reshapes the tile" not in str(e) or name == "both", (name, sched, transport, str(e))
                    continue
                cases.append(((name, sched, transport), prog, [inputs] * 2, ()))
                want[(name, sched, transport)] = (out, ref)
    ran = {(n, t) for n, _s, t in want}
    assert {("rows", "dma"), ("cols", "dma"), ("rows", "sm")} <= ran or world == 1, ran
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 22, timeout=300)
    for rank, res in enumerate(got):
        for key, outs in res.items():
            out, ref = want[key]
            for o in outs:
                assert float((o[out] - ref).abs().max()) < 1e-4, (rank, key)
