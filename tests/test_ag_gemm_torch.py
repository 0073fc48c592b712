"""Every schedule of examples/ag_gemm.tile against torch (`torch.cat(shards) @ B` in f32), not the reference.

One spawn per world size runs every (schedule, dtype, shape) case, three calls each on the same buffers with new
inputs every call (flags are epoch counters: never zeroed, so a stale flag would let a call read old tiles).
"""

from __future__ import annotations

import pytest

from tests import _workers
from tests._util import SCHEDULES, cat_shards, check_close, compile_example, make_calls
from tilec.runtime import spawn

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_shm_leftovers")]

WORLDS = (1, 2, 3, 4)
DTYPES = ("f16", "f32")
CALLS = 2  # a second call reuses the flags at the next epoch


def shapes(world: int) -> dict[str, dict[str, int]]:
    return {
        # tile-aligned (M = 192 for W = 3: 64 rows per rank), square where W divides 128
        "square": {"M": 192, "N": 128, "K": 128} if world == 3 else {"M": 128, "N": 128, "K": 128},
        # M/W = 33 rows per rank straddle the 64-row tiles; N and K are not multiples of BN, BK
        "ragged": {"M": 33 * world, "N": 72, "K": 40},
        # one row per rank; N, K smaller than a tile
        "row-per-rank": {"M": world, "N": 40, "K": 24},
    }


CASES = [(s, dt, shp) for s in SCHEDULES for dt in DTYPES for shp in ("square", "ragged", "row-per-rank")]


def _param(case):
    marks = []
    return pytest.param(*case, id="-".join(case), marks=marks)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"w{w}")
def ag_run(request):
    """Compile every case for this world, run them all in one spawn; (calls per case, outputs per rank)."""
    world = request.param
    cases, inputs = [], {}
    for i, (sched, dtype, shape) in enumerate(CASES):
        try:
            prog = compile_example(world, sched, shapes(world)[shape], dtype)
        except Exception as e:  # reported by that case's test; the other cases still run
            inputs[(sched, dtype, shape)] = e
            continue
        calls = make_calls(prog, CALLS, seed=1000 * world + i)
        inputs[(sched, dtype, shape)] = calls
        cases.append(((sched, dtype, shape), prog, calls, ()))
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(cases,))
    return world, inputs, results


@pytest.mark.parametrize("schedule,dtype,shape", [_param(c) for c in CASES])
def test_ag_gemm_matches_torch(ag_run, schedule, dtype, shape):
    world, inputs, results = ag_run
    calls = inputs[(schedule, dtype, shape)]
    if isinstance(calls, Exception):
        raise calls
    assert len(calls) == CALLS
    for i, per_rank in enumerate(calls):
        a = cat_shards(per_rank, "A")
        assert a.shape[0] == shapes(world)[shape]["M"]
        for r in range(world):
            want = a @ per_rank[r]["B"].float()  # each rank has its own B
            got = results[r][(schedule, dtype, shape)][i]["C"]
            check_close(got, want, dtype, f"world {world} rank {r} call {i + 1}")


@pytest.mark.parametrize("schedule", ["fused-push", "specialized"])
def test_new_tensors_each_call(schedule):
    """A program reuses its launch plan while a call's tensors stay the same; new tensors must be picked up."""
    prog = compile_example(2, schedule, shapes(2)["square"])
    calls = make_calls(prog, 3, seed=77)
    results = spawn(_workers.fresh_tensors_each_call, 2, heap_bytes=1 << 24, timeout=600, args=(prog, calls))
    for i, per_rank in enumerate(calls):
        a = cat_shards(per_rank, "A")
        for r in range(2):
            check_close(results[r][i]["C"], a @ per_rank[r]["B"].float(), "f16", f"rank {r} call {i + 1}")
