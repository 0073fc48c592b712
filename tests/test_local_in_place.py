"""local-in-place (passes/local_in_place.py) and the overlapped task order of fused-push (codegen/order.py).

What the pass does to examples/ag_gemm.tile (the copy skips a rank's own rows, the GEMM reads them from A), where
it declines, that the verifier rejects a wrong in-place rewrite, and runs against torch at worlds 1-4 (rows per
rank a multiple of the tile, so the pass and the interleaved order apply, and ragged rows, where it declines), with
the adversary starting one rank late in every call.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from types import SimpleNamespace

import pytest

from tests import _workers
from tests._util import cat_shards, check_close, compile_example, make_calls
from tilec.errors import VerifyError
from tilec.ir.graph import InPlace, copy_graph, sid, stage, tid, waits
from tilec.ir.types import ME, Load, map_expr
from tilec.passes.local_in_place import why_not
from tilec.passes.verify import verify
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

APPLIES = {"M": 256, "N": 72, "K": 40, "BM": 64}  # 128 rows per rank at world 2: whole 64-row tiles


def in_place_reads(g):
    return [x for x in stage(g, "gemm").reads() if isinstance(x, InPlace)]


@pytest.mark.parametrize("schedule", ["fused-push", "flags", "specialized"])
def test_the_copy_skips_local_rows_and_the_gemm_reads_them_in_place(schedule):
    prog = compile_example(2, schedule, APPLIES)
    g = prog.graph
    assert stage(g, "gather").skip_equal in (((ME, "r"),), (("r", ME),))
    assert len(in_place_reads(g)) == 1
    # the wait for a peer's rows is emitted under a test of the tile's rows; the local rows are never waited on
    assert re.search(r"\n\s+if m // 128 != rank:  # a peer's rows", prog.source)
    assert "tl.where(own, A + " in prog.source
    if schedule == "fused-push":  # the other rank's rows only, spread among the own tiles
        assert "gather_task(copied, " in prog.source
        assert "r = 1 - rank  # the one peer" in prog.source  # r != rank: at world 2, the other rank
        # 2 copy tasks (the other rank's 2 row tiles, each all of K at once: coarsen-copies) and 8 GEMM tiles
        assert "while task < 10:" in prog.source


def test_world_one_has_no_copy_at_all():
    g = compile_example(1, "fused-push", APPLIES).graph
    assert sid("gather") not in g and tid("Ag") not in g and not waits(g, "gemm")
    assert compile_example(1, "specialized", APPLIES).graph.nodes[sid("gather")]  # its programs need the copy


def test_it_declines_where_a_tile_straddles_ranks_or_a_counter_mixes_them():
    g = compile_example(2, "fused-push", {"M": 66, "N": 72, "K": 40}).snapshots["replace-barriers"]
    assert "straddles two ranks' rows" in why_not(g, stage(g, "gather"), 2)
    g = compile_example(2, "fused-push", APPLIES, granularity="tensor").snapshots["replace-barriers"]
    assert "counts the local copies together with the peers' copies" in why_not(g, stage(g, "gather"), 2)
    assert not stage(compile_example(2, "fused-push", APPLIES, granularity="tensor").graph, "gather").skip_equal


# -- the verifier against wrong in-place rewrites --------------------------------------------------------------------


def _after(schedule: str = "fused-push", dims=APPLIES):
    return copy_graph(compile_example(2, schedule, dims).snapshots["local-in-place"])


def _map_gemm(g, fn):
    st = stage(g, "gemm")
    body = tuple(dataclasses.replace(s, value=map_expr(s.value, fn)) for s in st.body)
    g.nodes[sid("gemm")]["payload"] = dataclasses.replace(st, body=body)


def _rejected(g) -> str:
    with pytest.raises(VerifyError) as e:
        verify(g, "mutant")
    return str(e.value)


@pytest.mark.parametrize("schedule", ["fused-push", "flags"])
def test_a_plain_read_of_rows_the_copy_no_longer_writes_is_rejected(schedule):
    g = _after(schedule)
    _map_gemm(g, lambda e: Load(e.read, e.dtype, e.shape, e.loc) if isinstance(e, InPlace) else e)
    assert "no earlier stage writes Ag[0, 0] on rank 0" in _rejected(g)


def test_an_in_place_read_of_another_copy_is_rejected():
    g = _after()
    _map_gemm(g, lambda e: dataclasses.replace(e, source=dataclasses.replace(e.source, tensor="B"))
              if isinstance(e, InPlace) else e)
    assert "stage 'gemm' pulls Ag[m, k] from B[m, k]" in _rejected(g)
    g = _after()  # the copy as it was pulled, not as it was pushed
    _map_gemm(g, lambda e: dataclasses.replace(e, source=dataclasses.replace(e.source, rank="r"))
              if isinstance(e, InPlace) else e)
    assert "stage 'gather' is not the copy" in _rejected(g)


def test_an_in_place_read_without_its_wait_is_rejected():
    g = _after()
    g.remove_edge("f:Ag.gather", sid("gemm"))
    assert "read before flag: stage 'gemm' reads Ag[m, k]" in _rejected(g)


def test_an_in_place_read_whose_tiles_straddle_ranks_is_rejected():
    g = _after(dims={"M": 66, "N": 72, "K": 40})  # the pass declined: 33 rows per rank
    cp = stage(g, "gather")
    st = cp.body[0]
    g.nodes[sid("gather")]["payload"] = dataclasses.replace(cp, skip_equal=((st.value.access.rank, st.access.rank),))
    _map_gemm(g, lambda e: InPlace(e.access, st.access, st.value.access, cp.loops, "f16", e.shape, e.loc)
              if isinstance(e, Load) and e.access.tensor == "Ag" else e)
    assert "straddles two ranks' rows" in _rejected(g)


def test_a_copy_that_keeps_its_local_tasks_still_verifies():
    g = _after()
    g.nodes[sid("gather")]["payload"] = dataclasses.replace(stage(g, "gather"), skip_equal=())
    verify(g, "mutant")  # the buffer then holds every row: reading some in place is still right


# -- against torch, the adversary on ------------------------------------------------------------------------------


def _shapes(world: int) -> dict[str, dict[str, int]]:
    return {"whole": {"M": 128 * world, "N": 72, "K": 40, "BM": 64},  # 2 row tiles per rank, ragged N and K
            "walked": {"M": 64 * world, "N": 64, "K": 64, "BM": 32, "BK": 32},  # k-steps walk one pointer
            "ragged": {"M": 33 * world, "N": 40, "K": 24}}  # straddling tiles: the pass declines


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_in_place_programs_match_torch_with_a_late_rank(world, monkeypatch):
    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.3")
    cases, calls = [], {}
    for sched in ("fused-push", "flags", "specialized"):
        for name, dims in _shapes(world).items():
            prog = compile_example(world, sched, dims)
            calls[(sched, name)] = make_calls(prog, 2, seed=7 * world + len(cases))
            cases.append(((sched, name), prog, calls[(sched, name)], ()))
            if name != "ragged" and world > 1:
                assert "tl.where(own" in prog.source, (sched, name)
            if sched == "fused-push" and name != "ragged" and world > 1:
                assert "td.program_major(task, " in prog.source  # the interleaved order
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(cases,))
    for key, ins_calls in calls.items():
        for i, ins in enumerate(ins_calls):
            for r in range(world):
                want = cat_shards(ins, "A") @ ins[r]["B"].float()
                check_close(results[r][key][i]["C"], want, "f16", f"{key} call {i} rank {r}")


# -- fused-pull's re-reads -----------------------------------------------------------------------------------------


def test_show_says_how_often_fused_pull_rereads_a_tile():
    prog = compile_example(2, "fused-pull", {"M": 256, "N": 192, "K": 128})
    assert "re-reads each tile of A 3 times (once per n)" in stage(prog.graph, "gemm").note


def test_auto_leaves_out_fused_pull_where_it_rereads_much():
    from tilec.perf.auto import REREAD_BYTES, rank_schedules, reread_bytes

    ag = "examples/ag_gemm.tile"
    big = {"M": 8192, "N": 4608, "K": 36864, "BM": 128, "BN": 256, "BK": 64}
    # the peer's 4096 x 36864 f16 rows, pulled 18 times instead of once
    assert reread_bytes(ag, 2, big) == 17 * 4096 * 36864 * 2 >= REREAD_BYTES
    assert "fused-pull" not in [s for s, _ in rank_schedules(ag, 2, big)]
    assert reread_bytes(ag, 1, big) == 0  # one rank: every re-read is local, as in any GEMM
    small = {"M": 256, "N": 192, "K": 128}
    assert 0 < reread_bytes(ag, 2, small) < REREAD_BYTES
    assert "fused-pull" in [s for s, _ in rank_schedules(ag, 2, small)]


def _simulate(source: str, kernel: str, world: int, nprog: int,
              claim: bool = False) -> dict[int, list[list[tuple[str, int]]]]:
    """Run the emitted persistent loop of `kernel` in plain Python with the task functions recording their task:
    {rank: [the (stage, task) list of each program]}. claim: the programs claim tasks from one counter (CLAIM), so
    the first program run takes them all, in the order any set of running programs would claim them."""
    body = source.split(f"def {kernel}(")[1].split("\n\n\n")[0]
    loop = body[body.index("    claim = EPOCH_AT"):]  # the static stride: td.first_task / next_task below
    loop = loop.replace(".to(tl.int32)", "")  # a comparison is a bool, which adds as 0/1
    loop = "\n".join(ln for ln in loop.splitlines() if "td.leave(" not in ln)  # the kernel's exit, not a task
    lines = loop.splitlines()
    code = "\n".join(ln[4:] for ln in lines)
    out = {}
    for rank in range(world):
        progs = []
        counter = itertools.count()
        for pid in range(nprog):
            ran: list[tuple[str, int]] = []
            td = SimpleNamespace(first_task=lambda pid, _claim, c, k=counter: next(k) if c else pid,
                                 next_task=lambda t, _claim, n, c, k=counter: next(k) if c else t + n,
                                 claims_done=lambda claim, n, c: None, program_major=_program_major)
            tl = SimpleNamespace(program_id=lambda axis, pid=pid: pid, minimum=min)
            env = {"tl": tl, "rank": rank, "NPROG": nprog, "ran": ran, "td": td, "EPOCH_AT": 0, "CLAIM": claim}
            env |= dict.fromkeys(("A", "Ag", "F_Ag_gather", "B", "C", "ERR", "heap_bases", "epoch", "timeout_ns",
                                  "INTERPRET"))
            for name in ("gather_task", "gemm_task"):
                env[name] = functools.partial(_record, ran, name[:-5])
            exec(compile(code, "<loop>", "exec"), env)
            progs.append(ran)
        out[rank] = progs
    return out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_the_interleaved_order_runs_every_task_once_and_copies_before_waiting(world):
    dims = {"M": 128 * world, "N": 192, "K": 96, "BM": 32, "BN": 64, "BK": 32}  # 4 row tiles per rank
    prog = compile_example(world, "fused-push", dims)
    per_peer = 1  # the copy's tasks per destination (m x k tiles, coarsened by coarsen-copies)
    for v in stage(prog.graph, "gather").loops:
        per_peer *= 1 if v.is_rank else v.trips
    copies, tiles = (world - 1) * per_peer, world * 4 * 3  # peers x tasks each; m x n tiles
    rows = dims["M"] // world
    for nprog in (1, 2, 5, 7, 16, 132):
        for rank, progs in _simulate(prog.source, "k0_gather_gemm", world, nprog).items():
            ran = [x for p in progs for x in p]
            gathers = sorted(t for s, t in ran if s == "gather")
            assert sorted(t for s, t in ran if s == "gemm") == list(range(tiles))
            assert gathers == list(range(copies))  # numbered as the stage runs them (it decodes r != rank itself)
            # every program computes about as many of this rank's tiles as the others (not a few programs all)
            own = [sum(1 for s, t in p if s == "gemm" and _row_of(t, dims) // rows == rank) for p in progs]
            assert max(own) - min(own) <= 2, (nprog, own)
            for p in progs:  # no program waits (a peer's rows) before it has made all its copies
                kinds = [s == "gather" for s, _ in p]
                last_copy = max((i for i, k in enumerate(kinds) if k), default=-1)
                waits = [i for i, (s, t) in enumerate(p) if s == "gemm" and _row_of(t, dims) // rows != rank]
                assert not waits or waits[0] > last_copy, (nprog, rank, p)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_claimed_tasks_run_the_interleaved_mix_in_task_order(world):
    """Claimed (CLAIM): the GEMM tiles come in the grouped order, this rank's rows first, one after another (the
    ~NPROG tiles running at once adjoin and share A and B panels in L2), the copies spread evenly among this rank's
    tiles and sent to the peers in the order they read them, and every copy is claimed before the first tile that
    waits on a peer's."""
    dims = {"M": 128 * world, "N": 192, "K": 96, "BM": 32, "BN": 64, "BK": 32}
    prog = compile_example(world, "fused-push", dims)
    assert "td.program_major(task, " in prog.source and ", NPROG, CLAIM)" in prog.source
    per_peer = 1
    for v in stage(prog.graph, "gather").loops:
        per_peer *= 1 if v.is_rank else v.trips
    copies, tiles = (world - 1) * per_peer, world * 4 * 3
    own = tiles // world
    rows = dims["M"] // world
    for nprog in (1, 5, 132):
        for rank, progs in _simulate(prog.source, "k0_gather_gemm", world, nprog, claim=True).items():
            ran = progs[0]  # the counter's order: the order the running programs claim in
            assert all(not p for p in progs[1:])
            gemms = [t for s, t in ran if s == "gemm"]
            assert gemms == [(k + rank * own) % tiles for k in range(tiles)]
            gathers = [t for s, t in ran if s == "gather"]
            assert sorted(gathers) == list(range(copies))
            # to the peers in the order they read this rank's rows (rank p reads p+1's first): rank - 1 first
            dests = [t // per_peer + (t // per_peer >= rank) for t in gathers]
            assert dests == [(rank - 1 - i) % world for i in range(world - 1) for _ in range(per_peer)]
            first_wait = next(i for i, (s, t) in enumerate(ran) if s == "gemm" and _row_of(t, dims) // rows != rank)
            assert all(s == "gemm" for s, _ in ran[first_wait:])
            # before each of this rank's tiles about copies / own copies (the mix opens with a tile): spread
            runs, n = [], 0
            for s, _ in ran[:first_wait]:
                if s == "gather":
                    n += 1
                else:
                    runs.append(n)
                    n = 0
            assert max(runs) <= -(-copies // own) and min(runs[1:]) >= copies // own - 1, runs
            assert sum(runs) + n == copies


def _program_major(task: int, n: int, nprog: int, claim: bool) -> int:
    """tilec.device.program_major: of the first n tasks, program p (tasks p, p + nprog, ...) runs one stretch;
    claimed tasks keep task order."""
    full = nprog * (n // nprog)
    return task % nprog * (n // nprog) + task // nprog if task < full and not claim else task


def _record(ran: list, stage_name: str, t, *args) -> None:
    ran.append((stage_name, int(t)))


def _row_of(t: int, dims) -> int:
    """The first row of GEMM task t in the grouped order the kernel decodes (group_m 4: a rank's rows)."""
    mt, nt = dims["M"] // dims["BM"], -(-dims["N"] // dims["BN"])
    gm = 4
    g_size = gm * nt
    first = t // g_size * gm
    rows = min(mt - first, gm)
    return (first + t % g_size % rows) * dims["BM"]


def test_a_skip_that_is_not_a_rank_loop_against_rank_is_rejected():
    g = _after()
    g.nodes[sid("gather")]["payload"] = dataclasses.replace(stage(g, "gather"), skip_equal=(("m", ME),))
    assert "skips the tasks where ('m', 'rank') are equal" in _rejected(g)


def test_flags_and_specialized_start_with_this_ranks_rows():
    for sched in ("flags", "specialized"):
        src = compile_example(2, sched, APPLIES).source
        assert "(task + rank * 4) % 8" in src, sched  # 8 GEMM tiles, this rank's 4 first


def test_coarse_copies_move_several_tiles_per_task():
    g = compile_example(2, "fused-push", {"M": 256, "N": 64, "K": 1024, "BM": 64, "BK": 32}).graph
    k = stage(g, "gather").loops[-1]
    assert (k.name, k.step) == ("k", 512)  # 64 x 512 f16: 64 KiB per task, 16 tiles
    f = next(iter(g.nodes[n]["payload"] for n in g if n.startswith("f:")))
    assert f.count == 2  # two tasks per row tile, each releasing its counter once
    ip = in_place_reads(g)[0]
    assert ip.write == stage(g, "gather").body[0].access and ip.producer == stage(g, "gather").loops
