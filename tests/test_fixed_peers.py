"""A fixed rank as a peer (`X@0[...]`, `X@(W - 1)[...]`, `X@(1 % W)[...]`: an affine peer expression whose
coefficients are all 0): a broadcast from a root (into a GEMM), a gather into a root read by every rank, against
torch at worlds 1-4 under every schedule and transport that applies (and tilec's reference interpreter on the same
calls); flags wait on the root's counters only; fused-pull says why it refuses."""

from __future__ import annotations

import pytest
import torch

import tilec
from tests import _workers
from tests._util import check_close, make_calls
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.run_vs_reference import compare_calls
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

# every rank pushes its rows into rank 0's B (a gather into a root), then every rank reads all of rank 0's B; D is
# read from the last rank and from rank 0 beside a ring neighbour, and rank 1 % W's A is broadcast
SRC = """program roots(world W)
  dims  M = 24, N = 16
  tiles BM = 16, BN = 16

  in  A : f32[M, N] symmetric
  buf B : f32[W*M, N] symmetric
  buf D : f32[M, N] symmetric
  out C : f32[W*M, N]
  out E : f32[M, N]
  out F : f32[M, N]

  stage put over m in M by BM:
    B@0[rank*M + m, :] = A[m, :]
    D[m, :] = A[m, :] * 2
  barrier
  stage all over q in W*M by BM:
    C[q, :] = B@0[q, :] + 1
  stage ends over m in M by BM:
    E[m, :] = D@(W - 1)[m, :] + D@0[m, :] - D@(rank + 1)[m, :]
    F[m, :] = A@(1 % W)[m, :]
"""


# rank W - 1's A broadcast into every rank's B, then a GEMM over it: a copy stage fused-pull refuses (no loop
# variable names the rank a tile came from) and the copy engines may run
BCAST = """program bcast(world W)
  dims  M = 24, N = 16, K = 32
  tiles BM = 16, BN = 16, BK = 16

  in  A  : f32[M, K] symmetric
  in  Wt : f32[K, N]
  buf B  : f32[M, K]
  out C  : f32[M, N]

  stage bcast over m in M by BM, k in K by BK:
    B[m, k] = A@(W - 1)[m, k]
  barrier
  stage mm over m in M by BM, n in N by BN:
    C[m, n] = sum k in K by BK: B[m, k] @ Wt[k, n]
"""


def _want(ins: list[dict[str, torch.Tensor]], r: int) -> dict[str, torch.Tensor]:
    w = len(ins)
    a = [d["A"] for d in ins]
    if "Wt" in ins[0]:
        return {"C": a[w - 1] @ ins[r]["Wt"]}
    return {"C": torch.cat(a) + 1, "E": 2 * (a[w - 1] + a[0] - a[(r + 1) % w]), "F": a[1 % w]}


@pytest.mark.parametrize("world, per_node", [(1, None), (2, None), (3, None), (4, None), (4, 1)])
def test_roots_match_torch_under_every_schedule(world, per_node):
    """per_node: backend nvshmem with that many ranks per node (the root off most ranks' node)."""
    nodes = {"backend": "nvshmem", "ranks_per_node": per_node} if per_node else {}
    batch, meta = [], {}
    for name, text in (("roots", SRC), ("bcast", BCAST)):
        for schedule in SCHEDULES:
            for transport in ("sm", "dma"):
                try:
                    prog = tilec.compile(f"{name}.tile", world=world, schedule=schedule, transport=transport,
                                         source=text, **nodes)
                except ScheduleError:
                    continue
                calls = make_calls(prog, 2, seed=world)
                key = f"{name} {schedule}+{transport}"
                batch.append((key, prog, calls, ()))
                meta[key] = (prog, calls)
    want = {"roots bsp+sm", "roots flags+sm", "bcast bsp+sm", "bcast flags+sm"}
    want |= set() if nodes else {"bcast flags+dma"}  # copy engines reach peers by pointer: on one node only
    assert want | ({"roots fused-push+sm", "bcast specialized+sm"} if world > 1 else set()) <= set(meta), sorted(meta)
    got = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(batch,))
    for key, (prog, calls) in meta.items():
        for i, per_rank in enumerate(calls):
            for r in range(world):
                for name, want in _want(per_rank, r).items():
                    check_close(got[r][key][i][name], want, "f32", f"{key} w{world} call {i} rank {r} {name}")
        bad = [row for row in compare_calls(prog, [got[r][key] for r in range(world)], calls) if not row.ok]
        assert not bad, (key, bad[:3])


def test_fused_pull_says_why_it_refuses_a_fixed_rank():
    with pytest.raises(ScheduleError, match=r"stage 'bcast' \(bcast.tile:10:9\) copies 'A' from a fixed rank \(3\)"):
        tilec.compile("bcast.tile", world=4, schedule="fused-pull", source=BCAST)


def test_flags_wait_on_the_root_alone():
    src = tilec.compile("roots.tile", world=4, schedule="flags", source=SRC).source
    body = src[src.index("# stage all"):]
    body = body[:body.index("task = td.next_task")]
    waits = [ln.strip() for ln in body.splitlines() if "td.wait" in ln]
    # every rank's push lands in rank 0's B: one wait, on rank 0's counters of the tile (one per sender)
    assert len(waits) == 1 and ", rank, 0, heap_bases" in waits[0], waits
