"""transport=dma: copy stages on the copy engines (passes/transport.py, codegen/dma.py, runtime/dma.py).

The graph and module (goldens), the chunk table (every element copied exactly once, local chunks first), the
schedules and programs it does not apply to (with the reason), the verifier rejecting wrong dma plans, the CLI
flag, and every program with a qualifying copy stage run on the CPU emulation (the plan executed by a thread as
host copies and flag writes, later than the kernels under the adversary) at worlds 1-4 with ragged shapes,
against torch."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

import tilec
from tests import _workers
from tests._util import cat_shards, check_close, compile_example, compile_program, make_calls, rel_err
from tests.test_new_programs import all_to_all, all_to_all_offset, place_gather, push_scale
from tilec.codegen.dma import dma_table
from tilec.errors import ArgumentError, ScheduleError, VerifyError
from tilec.ir.graph import DMA, InPlace, copy_graph, flags, sid, stage, stages, state_of, update_state
from tilec.passes.verify import verify

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")


def _dma(world=2, schedule="flags", dims=None, **kw):
    return compile_example(world, schedule, dims, transport="dma", **kw)


# -- the graph and the module ---------------------------------------------------------------------------------------


def test_goldens(golden):
    prog = _dma()
    golden("ag_gemm_w2/flags-dma.transport.txt", prog.show("transport"))
    golden("ag_gemm_w2/flags-dma.persist.txt", prog.show())
    golden("ag_gemm_w2/flags-dma.source.py", prog.source)


def test_the_copy_stage_leaves_the_kernels_and_its_flag_counts_one():
    prog = _dma()
    g = prog.graph
    assert stage(g, "gather").transport == DMA and stage(g, "gemm").transport == "sm"
    assert [k.stages for k in state_of(g).kernels] == [("gemm",)]
    assert state_of(g).kernels[0].persistent  # takes the chunks' tiles as they arrive
    assert [(f.name, f.count) for f in flags(g)] == [("Ag.gather", 1)]
    assert "[transport dma]" in prog.show() and "+1 per call" in prog.show()
    mod = prog.module
    assert [k[0].__name__ for k in mod.KERNELS] == ["k0_gemm"]
    assert mod.FLAGS["F_Ag_gather"][1] == 1 and set(mod.DMA_COPIES) == {0, 1}
    assert "def gather" not in prog.source and "k0_gather" not in prog.source


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("granularity", ["auto", "tile", "rank", "tensor"])
def test_every_element_is_copied_once_local_chunks_first(world, granularity):
    # ragged: 19 rows per rank in 8-row tiles, 21 columns in 16-column tiles
    prog = _dma(world, dims={"M": 19 * world, "N": 16, "K": 21, "BM": 8, "BN": 16, "BK": 16},
                granularity=granularity)
    (f,) = flags(prog.graph)
    table = dma_table(prog.graph)
    assert set(table) == set(range(world))
    rows = 19
    for q, chunks in table.items():
        seen = np.zeros((world * rows, 21), dtype=np.int64)
        counters = [(p, c) for p, c, _o, _cp in chunks]
        assert len(set(counters)) == len(counters) and all(c < f.size for _p, c in counters)  # each counter once
        if granularity != "tensor":
            assert chunks[0][3][0][1] == q  # this rank's own rows first
        for param, _counter, owner, copies in chunks:
            assert param == "F_Ag_gather" and owner == q
            for src, srank, so, sp, dst, drank, do, dp, width, n in copies:
                assert (src, dst, drank) == ("A", "Ag", q)
                for i in range(n):  # row i: elements do + i*dp .. + width of Ag, from A of rank srank
                    s_el = so + i * sp + np.arange(width)
                    d_el = do + i * dp + np.arange(width)
                    assert (s_el < rows * 21).all()
                    assert (d_el // 21 == srank * rows + s_el // 21).all() and (d_el % 21 == s_el % 21).all()
                    np.add.at(seen, (d_el // 21, d_el % 21), 1)
        assert (seen == 1).all()


def test_strided_chunks_for_a_column_gather():
    """ag_gemm_k gathers columns: a rank's block is rows of 12 contiguous elements, 24 apart (2-D copies)."""
    prog = compile_program("ag_gemm_k", 2, "flags", {"M": 20, "N": 16, "K": 24}, transport="dma", granularity="rank")
    chunks = dma_table(prog.graph)[1]
    assert [c[3] for c in chunks] == [(("A", 1, 0, 12, "Ag", 1, 12, 24, 12, 20),),
                                      (("A", 0, 0, 12, "Ag", 1, 0, 24, 12, 20),)]


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_the_copy_engines_leave_local_rows_in_place(schedule):
    """local-in-place on a dma stage: no chunk copies a rank's rows to itself, the GEMM reads them from A (and at
    world 1 nothing is left for the copy engines)."""
    prog = _dma(3, schedule, {"M": 96, "N": 32, "K": 32, "BM": 16})
    table = dma_table(prog.graph)
    assert all(cp[1] != cp[5] for chunks in table.values() for c in chunks for cp in c[3])
    assert sum(len(chunks) for chunks in table.values()) == 3 * 2 * 2  # 2 m-tiles to each of 2 peers, per rank
    assert any(isinstance(r, InPlace) for r in stage(prog.graph, "gemm").reads())
    assert dma_table(_dma(1, schedule, {"M": 32, "N": 32, "K": 32, "BM": 16}).graph) == {}


def test_fused_push_pushes_on_the_copy_engines():
    """fused-push's copy stores into peers: rank q's copy engines write its rows into every peer's Ag, then set
    that rank's counter (a peer's flag, over the peer mapping); its own rows the GEMM reads in place from A."""
    prog = _dma(3, "fused-push", {"M": 96, "N": 32, "K": 32, "BM": 16})
    assert state_of(prog.graph).kernels[0].stages == ("gemm",)
    chunks = dma_table(prog.graph)[1]  # rank 1: 2 m-tiles into each peer, the nearest (2) first, then 0
    assert [c[2] for c in chunks] == [2, 2, 0, 0]
    assert all(cp[1] == 1 and cp[5] == c[2] and cp[4] == "Ag" for c in chunks for cp in c[3])


def test_auto_keeps_the_sms_until_the_model_knows_copy_engines():
    auto, sm = compile_example(2, "flags", transport="auto"), compile_example(2, "flags")
    assert state_of(auto.graph).kernels == state_of(sm.graph).kernels
    assert "DMA_COPIES" not in auto.source and "transport(mode=auto)" in auto.source


# -- where it does not apply -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule,phrase", [
    ("bsp", "schedule bsp has barriers only"),
    ("fused-pull", "no copy stage can run on the copy engines (the schedule left no copy stage)"),
])
def test_schedules_without_a_copy_stage_to_move(schedule, phrase):
    with pytest.raises(ScheduleError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        _dma(schedule=schedule)


def test_a_copy_of_computed_tiles_stays_on_the_sms():
    """flash_decode's exchange copies partials a stage computes in the same call: a copy engine cannot wait."""
    with pytest.raises(ScheduleError, match=r"stage 'exchange': it reads 'Ol', which a stage writes in the same call"):
        tilec.compile("examples/flash_decode.tile", world=2, schedule="flags", transport="dma")
    with pytest.raises(ScheduleError, match=r"stage 'gather': it reads 'Cs'"):
        tilec.compile("examples/gemm_ar.tile", world=2, schedule="flags", transport="dma")


def test_a_bad_transport_is_the_callers_argument():
    with pytest.raises(ArgumentError, match=r"transport='ce': choose from sm, dma, auto"):
        compile_example(2, "flags", transport="ce")


def test_per_stage_transport():
    assert _dma().source == compile_example(2, "flags", transport="gather=dma").source.replace(
        "transport(mode=gather=dma)", "transport(mode=dma)")
    both = compile_program("place_gather_sym", 2, "flags", transport="place=dma,collect=sm")
    assert [(s.name, s.transport) for s in stages(both.graph)] == [("place", "dma"), ("collect", "sm")]
    assert state_of(compile_program("place_gather_sym", 2, "flags", transport="collect=sm").graph).kernels == \
        state_of(compile_program("place_gather_sym", 2, "flags").graph).kernels
    with pytest.raises(ScheduleError, match=r"stage 'collect' \(\S+\.tile:\d+:\d+\) cannot run on the copy engines:"
                                            r" it reads 'S', which a stage writes in the same call"):
        compile_program("place_gather_sym", 2, "flags", transport="collect=dma")
    with pytest.raises(ScheduleError, match=r"no stage named 'nope' here \(stages: gather, gemm"):
        compile_example(2, "flags", transport="nope=dma")
    with pytest.raises(ScheduleError, match=r"no stage named 'gather' here .*folded a copy stage away"):
        compile_example(2, "fused-pull", transport="gather=dma")
    with pytest.raises(ScheduleError, match=r"schedule bsp has barriers only"):
        compile_example(2, "bsp", transport="gather=dma")
    assert compile_example(2, "bsp", transport="gather=sm").source == compile_example(2, "bsp").source
    for bad in ("gather=ce", "gather", "=dma", "gather=dma,gather=sm"):
        with pytest.raises(ArgumentError, match=r"transport="):
            compile_example(2, "flags", transport=bad)


# -- the verifier rejects wrong plans ---------------------------------------------------------------------------------


def _mutant(g, name, **changes):
    h = copy_graph(g)
    h.nodes[sid(name)]["payload"] = replace(stage(h, name), **changes)
    return h


def test_verifier_rejects_a_dma_stage_that_reads_computed_tiles():
    prog = compile_program("chain", 2, "flags", {"M": 16})  # gather copies Y, which stage `relu` computes
    g = _mutant(prog.graph, "gather", transport=DMA)
    update_state(g, kernels=tuple(replace(k, stages=tuple(s for s in k.stages if s != "gather"))
                               for k in state_of(g).kernels if k.stages != ("gather",)))
    with pytest.raises(VerifyError, match=r"stage 'gather' cannot run on the copy engines: it reads 'Y'"):
        verify(g, "mutant")


def test_verifier_rejects_a_dma_stage_left_in_a_kernel():
    sm = compile_example(2, "flags").graph
    g = _mutant(sm, "gather", transport=DMA)
    with pytest.raises(VerifyError, match=r"stage 'gather' runs in 1 kernels, not none \(the copy engines run it\)"):
        verify(g, "mutant")


def test_verifier_rejects_a_flag_count_a_chunk_cannot_reach():
    """A chunk sets its counter once per call: waits for 4 (the SM count of this flag) would never complete."""
    g = copy_graph(_dma().graph)
    f = flags(g)[0]
    g.nodes[f"f:{f.name}"]["payload"] = replace(f, count=4)
    with pytest.raises(VerifyError, match=r"missing release: flag Ag.gather\[\d\] on rank \d is released 1 time\(s\)"
                                          r" per call, waits expect 4"):
        verify(g, "mutant")


def test_verifier_rejects_an_unknown_transport():
    g = _mutant(_dma().graph, "gemm", transport="nvlink")
    with pytest.raises(VerifyError, match=r"stage 'gemm' has transport 'nvlink', neither 'sm' nor 'dma'"):
        verify(g, "mutant")


def test_verifier_rejects_a_dma_stage_under_barriers():
    g = _mutant(compile_example(2, "bsp").graph, "gather", transport=DMA)
    update_state(g, kernels=tuple(k for k in state_of(g).kernels if k.stages != ("gather",)))
    with pytest.raises(VerifyError, match=r"cannot run on the copy engines: its consumers are ordered by barriers"):
        verify(g, "mutant")


# -- the command line ------------------------------------------------------------------------------------------------


def test_cli_transport_flag(capsys):
    from tilec.cli import main

    assert main(["show", "examples/ag_gemm.tile", "-w", "2", "-s", "flags", "--transport", "dma"]) == 0
    out = capsys.readouterr().out
    assert "[transport dma]" in out and "kernel k0_gemm: gemm  (persistent)" in out
    assert main(["show", "examples/ag_gemm.tile", "-w", "2", "-s", "flags", "--transport", "dma",
                 "--after", "transport"]) == 0
    assert "transport(mode=dma)" in capsys.readouterr().out
    assert main(["compile", "examples/ag_gemm.tile", "-w", "2", "-s", "flags", "--transport", "dma"]) == 0
    assert "DMA_COPIES = {" in capsys.readouterr().out
    assert main(["compile", "examples/ag_gemm.tile", "-w", "2", "-s", "bsp", "--transport", "dma"]) == 2
    assert "has barriers only" in capsys.readouterr().err
    assert main(["show", "examples/ag_gemm.tile", "-w", "2", "-s", "flags", "--transport", "gather=dma"]) == 0
    assert "[transport dma]" in capsys.readouterr().out
    for bad in ("ce", "gather=ce"):
        with pytest.raises(SystemExit):
            main(["show", "examples/ag_gemm.tile", "--transport", bad])
        assert "transport=" in capsys.readouterr().err


# -- running: every program with a qualifying copy stage, worlds 1-4, the adversary on -----------------------------


def _ag_rows(ins, r):
    return {"C": cat_shards(ins, "A") @ ins[r]["B"].float()}


def _ag_cols(ins, r):
    return {"C": cat_shards(ins, "A", dim=1) @ ins[r]["B"].float()}


def _cases(w: int):
    """(id, compile, expect, dtype) — ragged shapes everywhere."""
    def ex(dims, **kw):
        return lambda: _dma(w, kw.pop("schedule", "flags"), dims, **kw)

    def pr(name, dims, **kw):
        return lambda: compile_program(name, w, kw.pop("schedule", "flags"), dims, transport="dma", **kw)

    ag = {"M": 11 * w, "N": 20, "K": 40, "BM": 8, "BN": 16, "BK": 16}
    out = [("ag_gemm", ex(ag), _ag_rows, "f16"),
           ("ag_gemm-rank", ex(ag, granularity="rank"), _ag_rows, "f16"),
           ("ag_gemm-push", ex(ag, schedule="fused-push"), _ag_rows, "f16"),
           ("ag_gemm-specialized", ex(ag, schedule="specialized"), None, "f16")]
    if w in (2, 3):
        out += [
            ("ag_gemm-tile", ex(ag, granularity="tile"), _ag_rows, "f16"),
            ("ag_gemm-start-local", ex(ag, start_local=True), _ag_rows, "f16"),
            ("ag_gemm_k", pr("ag_gemm_k", {"M": 18, "N": 16, "K": 10 * w}), _ag_cols, "f16"),
            ("ag_gemm_local", pr("ag_gemm_local", {"M": 16 * w}), _ag_rows, "f16"),
            ("all_to_all", pr("all_to_all", {"M": 10 * w}), all_to_all, "f32"),
            ("all_to_all_offset", pr("all_to_all_offset", {"R": 9}), all_to_all_offset, "f32"),
            ("push_scale", pr("push_scale", {"M": 10 * w, "K": 20}), push_scale, "f32"),
            ("place_gather_sym", pr("place_gather_sym", None), place_gather, "f32"),
        ]
    return out


def _run(world: int):
    batch, meta = [], {}
    for i, (cid, make, expect, dtype) in enumerate(_cases(world)):
        try:
            prog = make()
        except ScheduleError as e:
            meta[cid] = e
            continue
        calls = make_calls(prog, 2, seed=900 + 10 * world + i)
        meta[cid] = (calls, expect, dtype)
        batch.append((cid, prog, calls, ()))
    results = torch_spawn(world, batch)
    return world, meta, results


def torch_spawn(world, batch):
    from tilec.runtime import spawn

    return spawn(_workers.run_cases, world, heap_bytes=1 << 23, timeout=600, args=(batch,))


_RUNS: dict[int, tuple] = {}


def _run_once(world: int):
    """One spawn per world for all its cases (the first test of that world pays for it)."""
    if world not in _RUNS:
        mp = pytest.MonkeyPatch()
        mp.setenv("TILEC_CPU_ADVERSARY", "0.2")  # rank processes inherit it: the copies start after the kernels
        try:
            _RUNS[world] = _run(world)
        finally:
            mp.undo()
    return _RUNS[world]


RUN_CASES = [(w, c[0]) for w in (1, 2, 3, 4) for c in _cases(w)]


@pytest.mark.slow
@pytest.mark.parametrize("world,case", RUN_CASES, ids=[f"w{w}-{c}" for w, c in RUN_CASES])
def test_dma_programs_match_torch(world, case):
    world, meta, results = _run_once(world)
    m = meta[case]
    if isinstance(m, Exception):
        assert case == "ag_gemm-specialized", m  # the gemm alone is left: nothing to specialize
        assert "specialized does not apply" in str(m)
        return
    calls, expect, dtype = m
    for i, ins in enumerate(calls):
        for r in range(world):
            want = expect(ins, r)
            got = results[r][case][i]
            for name in want:
                check_close(got[name], want[name], dtype, f"{case} world {world} rank {r} call {i + 1} {name}")


@pytest.mark.slow
def test_the_adversary_catches_a_consumer_that_does_not_wait_for_a_chunk(monkeypatch):
    """The copies start after the kernels under the adversary: a consumer without its waits, or with stale ones
    (waiting for 1 instead of the call's epoch), reads the last call's rows; the right program does not."""
    from tests.test_adversarial import _stale
    from tilec.runtime import spawn

    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.5")
    dims = {"M": 32, "N": 32, "K": 32, "BM": 16, "BN": 32, "BK": 16}
    progs = {}
    for name, fix in (("right", None), ("no waits", lambda s: re.sub(r"td\.wait(?:_all)?\([^\n]*", "pass", s)),
                      ("stale waits", _stale)):
        p = _dma(2, dims=dims)
        if fix is not None:
            p.source = fix(p.source)
            assert p.source != _dma(2, dims=dims).source
        progs[name] = p
    calls = {k: make_calls(p, 3, seed=43) for k, p in progs.items()}
    results = spawn(_workers.run_cases, 2, heap_bytes=1 << 22, timeout=600,
                    args=([(k, p, calls[k], ()) for k, p in progs.items()],))
    worst = {k: max(rel_err(results[r][k][i]["C"], _ag_rows(ins, r)["C"]) for i, ins in enumerate(calls[k])
                    for r in range(2)) for k in progs}
    assert worst["right"] < 2e-2 and worst["no waits"] > 0.1 and worst["stale waits"] > 0.1, worst


@pytest.mark.slow
def test_bench_times_a_dma_variant(tmp_path, monkeypatch):
    """`tilec bench --schedules flags+dma,fused-push`: the dma variant is a row of its own, its output checked."""
    from tilec.cli import main
    from tilec.perf import bench

    monkeypatch.setitem(bench.SHAPES, "small", [(128, 128, 64)])
    assert main(["bench", "examples/ag_gemm.tile", "-w", "2", "--schedules", "flags+dma,fused-push", "--iters", "2",
                 "--no-tune", "--backend", "cpu", "--out", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in json.loads((tmp_path / "ag_gemm_small_bf16.json").read_text())["rows"]}
    assert rows["flags+dma"]["kind"] == "tilec" and rows["flags+dma"]["rel_err"] < 5e-2
    assert "fused-push" in rows
    assert main(["bench", "examples/ag_gemm.tile", "--schedules", "flags+ce"]) == 2


def test_tax_report_names_the_copy_engine_stages():
    from tilec.perf.taxes import COPY_ENGINES, static

    st = static(_dma(2, dims={"M": 64, "N": 32, "K": 32, "BM": 16}))
    assert st.copy_engine_stages == ("gather",) and st.launches == 1
    gather = next(c for c in st.stage_costs if c.name == "gather")
    assert gather.kernel == COPY_ENGINES
    # one per chunk (not one per tile task): the peer's 2 m-tiles; this rank's own rows are read in place
    assert gather.flag_releases == 2
    assert static(compile_example(2, "flags")).copy_engine_stages == ()


@pytest.mark.slow
def test_a_chunk_that_never_comes_is_a_wait_timeout():
    """Rank 0 skips a call: rank 1's GEMM waits for chunks rank 0's copy engines never push, and the call ends
    with a WaitTimeout naming the flag after about the timeout, not a hang."""
    from tests.test_wait_timeout import late_call
    from tilec.runtime import spawn

    prog = _dma(2, "fused-push", {"M": 64, "N": 32, "K": 32, "BM": 32, "BN": 32, "BK": 32}, wait_timeout=2.0)
    inputs = make_calls(prog, 1, seed=5)[0]
    _, (elapsed, msg) = spawn(late_call, 2, heap_bytes=1 << 22, timeout=240, args=(prog, inputs))
    assert msg is not None and "Ag.gather" in msg, msg
    assert 2.0 <= elapsed < 12.0, elapsed
