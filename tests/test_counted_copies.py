"""A copy whose rows a data-dependent count bounds (`upto cnt[o]`) under every schedule and transport: rows past the
count are never copied, so a consumer sees what the buffer held (zeros on the first call). The passes that would
change that refuse, saying why: a push runs the copy on the sending rank, whose `cnt` is its own; a pull or an
in-place read reads the source for every row; a wider copy step reads one block's count for several. Against torch
at worlds 1-3, with counts of 0, ragged, full, and different per rank."""

from __future__ import annotations

import pytest
import torch

import tilec
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.runtime import spawn

BACK = """program back(world W)
  dims  M = 48, H = 16
  tiles BM = 16
  in  cnt : i32[W]
  in  Y   : f32[W, M, H] symmetric
  out Z   : f32[W*M, H]
  buf Yb  : f32[W*M, H] symmetric
  stage back over o in ranks, j in M by BM upto cnt[o]:
    Yb[o*M + j, :] = Y@o[rank, j, :]
  barrier
  stage use over i in W*M by BM:
    Z[i, :] = Yb[i, :] * 2
"""


def _cases(world):
    g = torch.Generator().manual_seed(world)
    ys = [torch.randn(world, 48, 16, generator=g) for _ in range(world)]
    counts = [torch.tensor([(0, 48, 21, 5)[(r + o) % 4] for o in range(world)], dtype=torch.int32)
              for r in range(world)]
    want = []
    for r in range(world):
        z = torch.zeros(world * 48, 16)
        for o in range(world):
            n = int(counts[r][o])
            z[o * 48:o * 48 + n] = 2 * ys[o][r, :n]
        want.append(z)
    cases, refused = [], {}
    for sched in SCHEDULES:
        for transport in ("sm", "dma"):
            try:
                prog = tilec.compile("tests/back.tile", source=BACK, world=world, schedule=sched, transport=transport)
            except ScheduleError as e:
                refused[(sched, transport)] = str(e)
                continue
            cases.append(((sched, transport), prog, [[{"cnt": counts[r], "Y": ys[r]} for r in range(world)]], ()))
    return cases, want, refused


@pytest.mark.parametrize("world", [1, 2, 3])
def test_counted_copies_keep_the_rows_past_their_count_untouched(world):
    cases, want, refused = _cases(world)
    assert {("bsp", "sm"), ("flags", "sm")} <= {k for k, *_ in cases}
    if world > 1:
        assert "counts its rows by cnt[o]" in refused[("fused-push", "sm")], refused
        assert "copies only the rows under its count cnt[o]" in refused[("fused-pull", "sm")], refused
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 22, timeout=300)
    for rank, res in enumerate(got):
        for key, (out,) in res.items():
            err = float((out["Z"].float() - want[rank]).abs().max())
            assert err < 1e-6, (rank, key, err)
