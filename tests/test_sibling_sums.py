"""GEMM sums of one expression over the same reduction (SwiGLU's `silu(x @ W1) * (x @ W3)`) run in one loop with an
accumulator each and their shared operand tile loaded once per step (Compute.sums_in_one_loop): the loops the
kernels hold, and the results against torch under every schedule at worlds 1 and 2, with ragged reductions, sums
of other variables and sums over gathered rows (which keep a loop each) beside them."""

from __future__ import annotations

import re

import pytest
import torch

import tilec
from tests import _workers
from tests._util import check_close, make_calls
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

# A: this rank's rows, gathered into Ag (so under fused schedules the GEMMs read peers' rows in place); X: local
SRC = """program siblings(world W)
  dims  M = 32, K = 64, N = 32, R = 40
  tiles BM = 16, BN = 16, BK = 16

  in  A  : f32[M/W, K] symmetric
  in  X  : f32[M, K]
  in  Xr : f32[M, R]
  in  W1 : f32[K, N]
  in  W3 : f32[K, N]
  in  Wr : f32[R, N]
  in  Wq : f32[R, N]
  buf Ag : f32[M, K]
  out G  : f32[M, N]
  out Y  : f32[M, N]
  out Z  : f32[M, N]
  out Q  : f32[M, N]

  stage gather over r in ranks, m in M/W by BM, k in K by BK:
    Ag[r*M/W + m, k] = A@r[m, k]
  barrier
  stage mlp over m in M by BM, n in N by BN:
    G[m, n] = silu(sum k in K by BK: Ag[m, k] @ W1[k, n]) * (sum k in K by BK: Ag[m, k] @ W3[k, n])
    Y[m, n] = 2 * (sum k in K by BK: X[m, k] @ W1[k, n]) - (sum k in K by BK: X[m, k] @ W3[k, n]) +
              (sum j in K by BK: X[m, j] @ W3[j, n])
    Z[m, n] = (sum i in R by BK: Xr[m, i] @ Wr[i, n]) * (sum i in R by BK: Xr[m, i] @ Wq[i, n])
    Q[m, n] = (sum k in K by BK: X[m, k].T.T @ W1[k, n]) + (sum k in K by BK: X[m, k] @ W1[k, n])
"""


def _want(ins: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    a = torch.cat([d["A"] for d in ins])
    x, xr, w1, w3, wr, wq = (ins[0][n] for n in ("X", "Xr", "W1", "W3", "Wr", "Wq"))
    return {"G": torch.nn.functional.silu(a @ w1) * (a @ w3), "Y": 2 * (x @ w1) - x @ w3 + x @ w3,
            "Z": (xr @ wr) * (xr @ wq), "Q": 2 * (x @ w1)}


def _same_weights(calls):  # every rank holds the same X, Xr and weights (the reference uses rank 0's)
    for per_rank in calls:
        for d in per_rank[1:]:
            for n in ("X", "Xr", "W1", "W3", "Wr", "Wq"):
                d[n] = per_rank[0][n].clone()
    return calls


def _mlp_source(src: str) -> str:
    return src[src.index("stage mlp"):]


def test_sums_over_one_reduction_share_a_loop():
    mlp = _mlp_source(tilec.compile("siblings.tile", world=1, schedule="bsp", source=SRC).source)
    loops = re.findall(r"for (\w+) in range\(0, (\d+), 16\)", mlp)
    # G's two sums, Y's two over k (its sum over j keeps a loop): one loop each; Z's ragged pair (R = 40) and Q's
    # pair (one operand transposed twice, not a tile read straight from memory): a loop per sum
    assert loops.count(("k", "64")) == 4 and loops.count(("j", "64")) == 1 and loops.count(("i", "40")) == 2, loops
    # the shared tile is loaded once per step: one load of Ag per loop of G, both accumulators fed from it
    g = mlp[:mlp.index("tl.store")]
    assert len(re.findall(r"= tl\.load\(ag_ptrs", g)) == 1 and g.count("td.dot(ag_tile, ") == 2, g


@pytest.mark.parametrize("world", [1, 2])
def test_sibling_sums_match_torch_under_every_schedule(world):
    batch, calls = [], {}
    for schedule in SCHEDULES:
        try:
            prog = tilec.compile("siblings.tile", world=world, schedule=schedule, source=SRC)
        except ScheduleError:
            continue
        calls[schedule] = _same_weights(make_calls(prog, 2, seed=5 + world))
        batch.append((schedule, prog, calls[schedule], ()))
    assert len(batch) >= 3, [k for k, *_ in batch]
    got = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(batch,))
    for schedule, per_call in calls.items():
        for i, ins in enumerate(per_call):
            for name, want in _want(ins).items():
                for r in range(world):
                    check_close(got[r][schedule][i][name], want, "f32", f"{schedule} w{world} call {i} {name}")
