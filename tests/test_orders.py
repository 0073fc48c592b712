"""Orders of rank loops: a gather into reversed blocks (`Ag[(W-1-r)*M/W + m, k]`), a push into reversed blocks
(`Ag@r[(W-1-rank)*M/W + m, k]`) and a reduce-scatter to reversed owners under every schedule, flag granularity and
the copy engines, on 2 and 3 CPU ranks against torch (one spawn per world); the verifier rejects counters that
would shrink with the element."""

from __future__ import annotations

import pytest
import torch

from tests import _workers
from tests._util import SCHEDULES, check_close, compile_program, make_calls
from tilec.cli import main as cli_main
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")


def reversed_rows(ins, name):
    """Every rank's `name` stacked with rank W-1 first (block W-1-r holds rank r's rows)."""
    return torch.cat([d[name].float() for d in reversed(ins)])


def ag_gemm_reversed(ins, r):
    return {"C": reversed_rows(ins, "A") @ ins[r]["B"].float()}


def push_reversed(ins, r):
    return {"C": reversed_rows(ins, "A") * 2 + 1}


def gather_max_reversed(ins, r):
    ag = reversed_rows(ins, "A")
    return {"S": (-ag.abs() - 1).amax(1), "T": ag.T}


def gemm_rs_reversed(ins, r):
    full = sum(d["A"].float() @ d["B"].float() for d in ins)
    rows = full.shape[0] // len(ins)
    o = len(ins) - 1 - r
    return {"C": full[o * rows:(o + 1) * rows]}


# (case, program, dims at world w, expected, dtype, schedules, compile options)
def cases(w: int):
    return [
        ("gather", "ag_gemm_reversed", {"M": 32 * w}, ag_gemm_reversed, "f16", SCHEDULES, {}),
        # ragged: 20 rows per rank in 16-row tiles, so tiles straddle the reversed blocks
        ("gather-ragged", "ag_gemm_reversed", {"M": 20 * w, "N": 24}, ag_gemm_reversed, "f16", SCHEDULES, {}),
        *[(f"gather-{g}-flags", "ag_gemm_reversed", {"M": 32 * w}, ag_gemm_reversed, "f16", ("flags",),
           {"granularity": g}) for g in ("tile", "rank")],
        ("gather-dma", "ag_gemm_reversed", {"M": 32 * w}, ag_gemm_reversed, "f16", ("flags", "fused-push"),
         {"transport": "dma"}),
        ("push", "push_reversed", {"M": 16 * w}, push_reversed, "f32", ("bsp", "flags", "fused-push", "specialized"),
         {}),
        # padding lanes of the pulled tile must not win the row maximum (a pull's lanes past K are 0, -abs(0)-1 > all)
        ("gather-max", "gather_max_reversed", {"M": 16 * w}, gather_max_reversed, "f32", SCHEDULES, {}),
        # rank o gets the reduced rows of block W-1-o: a reversed rank in a dim of its own (the partial's slot)
        ("reduce-scatter", "gemm_rs_reversed", {"M": 32 * w, "K": 16 * w}, gemm_rs_reversed, "f16",
         ("bsp", "flags", "fused-push", "specialized"), {}),
    ]


@pytest.fixture(scope="module", params=(2, 3), ids=lambda w: f"w{w}")
def orders_run(request):
    world = request.param
    batch, meta = [], {}
    for i, (cid, program, dims, expect, dtype, schedules, kw) in enumerate(cases(world)):
        for j, s in enumerate(schedules):
            prog = compile_program(program, world, s, dims, **kw)
            calls = make_calls(prog, 2, seed=9100 + 100 * world + 10 * i + j)
            meta[(cid, s)] = (calls, expect, dtype)
            batch.append(((cid, s), prog, calls, ()))
    # the adversary starts one rank's kernels late, so a wait on the wrong counters reads rows not there yet
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEC_CPU_ADVERSARY", "0.05")
    try:
        results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(batch,))
    finally:
        mp.undo()
    return world, meta, results


ALL = [(cid, s) for cid, _p, _d, _e, _t, schedules, _kw in cases(2) for s in schedules]


@pytest.mark.slow
@pytest.mark.parametrize("case,schedule", ALL, ids=[f"{c}-{s}" for c, s in ALL])
def test_reversed_order_matches_torch(orders_run, case, schedule):
    world, meta, results = orders_run
    calls, expect, dtype = meta[(case, schedule)]
    for i, ins in enumerate(calls):
        for r in range(world):
            want = expect(ins, r)
            got = results[r][(case, schedule)][i]
            for name in want:
                check_close(got[name], want[name], dtype, f"{case} {schedule} world {world} rank {r} call {i + 1}")


def test_reversed_gather_is_verified_under_every_schedule(capsys):
    assert cli_main(["check", "tests/programs/ag_gemm_reversed.tile", "-w", "3"]) == 0
    out = capsys.readouterr().out
    for s in SCHEDULES:
        (line,) = [ln for ln in out.splitlines() if ln.startswith(f"  {s} ")]
        assert "verified" in line, line
    assert f"{len(SCHEDULES)} of {len(SCHEDULES)} schedules verified for world 3" in out


def test_reversed_gather_reads_its_own_rows_in_place():
    """local-in-place solves the reversed block too: the GEMM reads this rank's rows from A, the peers' from Ag."""
    src = compile_program("ag_gemm_reversed", 3, "flags").source
    assert "own = idx_rk == rank" in src and "idx_rk = 2 - (idx + 64) // 32" in src


def test_reversed_push_is_a_push_under_fused_pull_too():
    """fused-pull refuses the hand-written push for what it is (a push), not for its order."""
    from tilec.errors import ScheduleError

    located = r"'Ag' is not a buffer written only locally by stage 'push' \(\S+\.tile:\d+:\d+\)"
    with pytest.raises(ScheduleError, match=located):
        compile_program("push_reversed", 2, "fused-pull")


def test_verifier_rejects_counters_that_shrink_with_the_element(monkeypatch):
    """Were a reversed order's counters numbered by the rank itself, they would shrink as the element grows and a
    wait's range first..last would be empty: the verifier says so (the kernels then read rows not there yet)."""
    from tilec.errors import VerifyError
    from tilec.ir import tiling

    def by_rank(self, r, t):
        out = r * (self.trips if self.key_tile else 1) if self.key_rank else 0
        return out + (t if self.key_tile else 0)

    monkeypatch.setattr(tiling.DimInverse, "lin_of", by_rank)
    with pytest.raises(VerifyError) as info:
        compile_program("ag_gemm_reversed", 3, "flags", {"M": 60}, transport="dma")
    assert "read before flag: stage 'gemm' reads Ag[m, k], but its wait on Ag.gather covers counters 5..2 of dim 0" \
           " where the task m=16 reads tiles of counters 2..5" in str(info.value)
