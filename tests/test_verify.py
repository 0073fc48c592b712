"""The verifier on broken graphs: take a verified graph (tilec.compile(...).graph or a snapshot), break a copy with
networkx, and expect VerifyError naming the broken rule."""

from __future__ import annotations

import dataclasses

import pytest

import tilec
from tests._util import SCHEDULES, compile_example, compile_program
from tilec.errors import ScheduleError, VerifyError
from tilec.ir.graph import Barrier, Flag, Wait, copy_graph, flags, sid, stage, state_of, update_state
from tilec.ir.types import ME, Access, Affine
from tilec.passes.verify import RULES, verify

RULE_NAMES = {"structure", *(name for name, _ in RULES)}


@pytest.fixture(scope="module")
def graphs():
    # per-tile flags (not the automatic choice), so the counters below are the ones named
    return {s: compile_example(2, s, {"M": 128, "N": 64, "K": 64}, granularity="tile") for s in SCHEDULES}


def broken(graphs, schedule: str, after: str | None = None):
    prog = graphs[schedule]
    return copy_graph(prog.snapshots[after] if after else prog.graph)


def problems(g) -> str:
    with pytest.raises(VerifyError) as info:
        verify(g, "test")
    e = info.value
    assert e.pass_name == "test" and str(e).endswith("note: the verifier rejected the graph after pass 'test'")
    # every problem a located diagnostic, printed as the parser's: file:line:col: error: ..., then a caret
    assert all(p.startswith(f"{d.loc}: error: ") or p.startswith(f"{d.loc.file}: error: ")
               for d, p in zip(e.diagnostics, e.problems, strict=True))
    assert all(d.kind in RULE_NAMES for d in e.diagnostics), [d.kind for d in e.diagnostics]
    return "; ".join(e.problems)


def _set_flag(g, name: str, **changes) -> None:
    n = f"f:{name}"
    g.nodes[n]["payload"] = dataclasses.replace(g.nodes[n]["payload"], **changes)


def test_every_snapshot_verifies(graphs):
    for prog in graphs.values():
        for name, g in prog.snapshots.items():
            verify(copy_graph(g), name)


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_missing_release_edge(graphs, schedule):
    g = broken(graphs, schedule)
    g.remove_edge(sid("gather"), "f:Ag.gather")
    assert "missing release: stage 'gather' does not release flag Ag.gather" in problems(g)


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_count_too_high_is_a_missing_release(graphs, schedule):
    g = broken(graphs, schedule)
    n = flags(g)[0].count
    _set_flag(g, "Ag.gather", count=n + 1)
    # counter 0 holds rank 0's own rows, which local-in-place no longer copies (released 0 times, waited on never)
    assert f"missing release: flag Ag.gather[2] on rank 0 is released {n} time(s) per call, waits expect" \
        f" {n + 1}" in problems(g)


def test_count_too_low_is_a_double_release(graphs):
    g = broken(graphs, "flags")
    n = flags(g)[0].count
    _set_flag(g, "Ag.gather", count=n - 1)
    assert f"double release: flag Ag.gather[2] on rank 0 is released {n} time(s) per call, waits expect {n - 1}" \
        in problems(g)


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_read_before_flag_when_the_wait_is_removed(graphs, schedule):
    g = broken(graphs, schedule)
    g.remove_edge("f:Ag.gather", sid("gemm"))
    assert "read before flag: stage 'gemm' reads Ag[m, k] (written by stage 'gather') without a barrier or a wait" \
        in problems(g)


def _drop_barrier(g):
    g.remove_node("b:0")
    update_state(g, order=tuple(n for n in state_of(g).order if n != "b:0"))
    if state_of(g).kernels is not None:
        update_state(g, kernels=tuple(dataclasses.replace(k, barrier_before=False) for k in state_of(g).kernels))
    return g


def test_read_needs_the_barrier_without_flags(graphs):
    # gather writes Ag locally (it pulls A from peers), so program order on each rank still orders gemm's read
    verify(_drop_barrier(broken(graphs, "bsp")), "test")
    h = _drop_barrier(broken(graphs, "fused-push", "fuse-comm"))  # peers store into Ag: gemm's local read races
    assert "read before flag: stage 'gemm' reads Ag[m, k]" in problems(h)


def test_kernels_must_wait_where_the_program_has_a_barrier(graphs):
    g = broken(graphs, "bsp")
    update_state(g, kernels=tuple(dataclasses.replace(k, barrier_before=False) for k in state_of(g).kernels))
    text = problems(g)
    assert "kernel k1_gemm does not wait at a global barrier before it, but the program has barrier before stage" \
        " 'gemm'" in text
    assert text.startswith("examples/ag_gemm.tile:16:9: error: ")  # the consumer stage's line


def test_wait_that_names_another_tile_is_never_emitted(graphs):
    g = broken(graphs, "flags")
    (w,) = g.edges["f:Ag.gather", sid("gemm")]["waits"]
    # the wait claims to read one row further down: the emitter places a wait only before the read it names
    m, k = w.read.index
    shifted = dataclasses.replace(w, read=dataclasses.replace(w.read, index=(Affine(m.terms, m.const + 1), k)))
    g.edges["f:Ag.gather", sid("gemm")]["waits"] = (shifted,)
    text = problems(g)
    assert "examples/ag_gemm.tile:17:33: error: the wait on Ag.gather before Ag[m + 1, k] is never emitted" in text
    assert "read before flag: stage 'gemm' reads Ag[m, k] (written by stage 'gather') without a barrier" in text


def _add_reverse_flag(g):
    """gemm releases a flag on its C tiles, and gather waits on it: a wait from the producer back to its consumer."""
    gemm = stage(g, "gemm")
    write = gemm.body[0].access  # C[m, n]
    f = Flag("C.gemm", "C", "gemm", write, ("m", "n"), 2 * 1, 1, "tile", gemm.loc)
    g.add_node("f:C.gemm", kind="flag", payload=f)
    g.add_edge(sid("gemm"), "f:C.gemm", kind="release")
    # a read of C in gather's own loop variables (m: 64 rows of the shard, k: a 32-column tile)
    read = Access("C", ME, (Affine((("m", 1),), 0), Affine((("k", 1),), 0)), ("m", "k"), (64, 32), gemm.loc)
    g.add_edge("f:C.gemm", sid("gather"), kind="wait", waits=(Wait("C.gemm", read, "gemm", "C", gemm.loc),))
    return g


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_wait_cycle(graphs, schedule):
    g = _add_reverse_flag(broken(graphs, schedule))
    text = problems(g)
    assert "stage 'gather' waits on stage 'gemm', which comes later: a program that may not be running" in text
    assert "wait cycle: " in text and "gather" in text.split("wait cycle: ")[1]


def test_wait_on_own_flag(graphs):
    g = broken(graphs, "fused-push")
    (w,) = g.edges["f:Ag.gather", sid("gemm")]["waits"]
    gather = stage(g, "gather")
    read = gather.body[0].access  # Ag@r[m + 64*rank, k], in gather's variables
    g.add_edge("f:Ag.gather", sid("gather"), kind="wait", waits=(Wait("Ag.gather", read, "gather", "Ag", gather.loc),))
    text = problems(g)
    assert "stage 'gather' waits on its own flag Ag.gather: a program that may not be running" in text
    assert "wait cycle: gather" in text


def test_barrier_left_after_replace_barriers(graphs):
    g = broken(graphs, "flags")
    g.add_node("b:7", kind="barrier", payload=Barrier(7, stage(g, "gemm").loc))
    order = list(state_of(g).order)
    update_state(g, order=(order[0], "b:7", *order[1:]))
    assert "a global barrier is left after replace-barriers" in problems(g)


def test_self_waiting_kernel_must_be_persistent(graphs):
    g = broken(graphs, "fused-push")
    (k,) = state_of(g).kernels
    update_state(g, kernels=(dataclasses.replace(k, persistent=False),))
    assert "kernel k0_gather_gemm waits on its own programs but is not persistent" in problems(g)


def test_stage_order_reversed(graphs):
    g = broken(graphs, "bsp")
    update_state(g, order=tuple(reversed(state_of(g).order)))
    assert "stage 'gemm' reads 'Ag' before stage 'gather' writes it" in problems(g)


def test_structure_problems(graphs):
    g = broken(graphs, "fused-push")
    (k,) = state_of(g).kernels
    update_state(g, kernels=(dataclasses.replace(k, stages=(*k.stages, "ghost")),))
    assert problems(g) == "examples/ag_gemm.tile: error: kernel k0_gather_gemm runs unknown stage 'ghost'"
    g = broken(graphs, "bsp")
    update_state(g, order=tuple(n for n in state_of(g).order if n != sid("gemm")))
    assert "stage 'gemm' is not in the program order" in problems(g)


def test_wait_on_unknown_flag(graphs):
    g = broken(graphs, "flags")
    (w,) = g.edges["f:Ag.gather", sid("gemm")]["waits"]
    g.edges["f:Ag.gather", sid("gemm")]["waits"] = (dataclasses.replace(w, flag="Ag.nobody"),)
    assert "stage 'gemm' waits on unknown flag Ag.nobody" in problems(g)


def test_a_stage_reading_its_own_output(graphs):
    g = broken(graphs, "bsp")
    gemm = stage(g, "gemm")
    (st,) = gemm.body
    from tilec.ir.types import Load, Op

    c = Load(st.access, "f16", st.access.shape, st.loc)
    g.nodes[sid("gemm")]["payload"] = dataclasses.replace(gemm, body=(dataclasses.replace(
        st, value=Op("+", (st.value, c), "f32", st.access.shape, st.loc)),))
    assert "stage 'gemm' reads 'C', which it writes itself" in problems(g)


def _order_names_a_ghost(g):
    update_state(g, order=(*state_of(g).order, "s:ghost"))
    return "program order names 's:ghost', which is not a stage or barrier of the graph"


def _flag_without_producer(g):
    _set_flag(g, "Ag.gather", producer="nobody")
    return "missing release: flag Ag.gather has no producer stage 'nobody'"


def _wait_with_foreign_variables(g):
    gemm = stage(g, "gemm")
    read = gemm.body[0].access  # C[m, n]: n is not a loop variable of gather
    g.add_edge("f:Ag.gather", sid("gather"), kind="wait", waits=(Wait("Ag.gather", read, "gather", "Ag", gemm.loc),))
    return "examples/ag_gemm.tile:16:9: error:" \
        " stage 'gather' waits on Ag.gather, a flag of 'Ag', before reading C[m, n]"


@pytest.mark.parametrize("breakage", [_order_names_a_ghost, _flag_without_producer, _wait_with_foreign_variables],
                         ids=["order-ghost", "flag-without-producer", "wait-foreign-vars"])
def test_verifier_reports_instead_of_crashing(graphs, breakage):
    """Malformed graphs are reported, not a KeyError from deep inside a rule."""
    g = broken(graphs, "flags")
    expected = breakage(g)
    assert expected in problems(g)


def test_wait_narrower_than_the_read(graphs):
    g = broken(graphs, "flags")
    (w,) = g.edges["f:Ag.gather", sid("gemm")]["waits"]
    narrow = dataclasses.replace(w, read=dataclasses.replace(w.read, tile=(None, "k"), shape=(1, 32)))
    assert str(narrow.read) == str(w.read)
    g.edges["f:Ag.gather", sid("gemm")]["waits"] = (narrow,)
    text = problems(g)
    # the emitter finds a read's waits by the whole access (tile vars and extents too): this one is never placed
    assert "examples/ag_gemm.tile:17:33: error: the wait on Ag.gather before Ag[m, k] is never emitted: stage 'gemm'" \
        " reads no tile Ag[m, k] with these tile vars and extents (-:1, k:32)" in text
    assert "read before flag: stage 'gemm' reads Ag[m, k] (written by stage 'gather') without a barrier" in text


def test_flag_of_a_reversed_copy_under_the_old_reads(graphs):
    g = broken(graphs, "flags")
    f = flags(g)[0]
    # gather stores rank r's rows at block 1 - r (a reversed order: invertible), while the GEMM still reads as
    # the copy of block r was read: its in-place read and its wait no longer match what the copy does
    bad = dataclasses.replace(f.write, index=(Affine((("m", 1), ("r", -64)), 64), f.write.index[1]))
    _set_flag(g, "Ag.gather", write=bad)
    gather = stage(g, "gather")
    g.nodes[sid("gather")]["payload"] = dataclasses.replace(
        gather, body=(dataclasses.replace(gather.body[0], access=bad),))
    text = problems(g)
    assert "examples/ag_gemm.tile:17:33: error: stage 'gemm' reads Ag[m, k] in place from A@r[m, k]: stage" \
        " 'gather' is not the copy" in text
    assert "which is released 0 time(s) per call, not 1: the wait can never complete" in text


def test_flag_that_counts_another_store(graphs):
    g = broken(graphs, "flags")
    f = flags(g)[0]
    _set_flag(g, "Ag.gather", write=dataclasses.replace(f.write, rank="r"))  # its counters would live on peers
    assert "flag Ag.gather counts stores Ag@r[m + 64*r, k] into 'Ag', which stage 'gather' does not make" \
        in problems(g)


def test_schedule_errors_are_not_verify_errors():
    with pytest.raises(ScheduleError, match=r"fused-pull does not apply: .*'Y'"):
        compile_program("chain", 2, "fused-pull")


def test_what_cannot_be_decided_is_rejected(monkeypatch):
    """place_gather's store S[rank*M + m, n] ties the rank holding S to its rows: a block over two axes, decided
    on a raster. Beyond the raster limit the verifier says so and rejects instead of trusting the graph."""
    from tilec.ir import regions

    compile_program("place_gather", 2, "bsp")
    monkeypatch.setattr(regions, "CELLS", 16)
    with pytest.raises(VerifyError) as info:
        compile_program("place_gather", 2, "bsp")
    text = str(info.value)
    assert "tests/programs/place_gather.tile:14:21: error:" \
        " cannot prove that stage 'collect' reads S@r[m + 32*r, n] is" \
        " right: a block of 128 elements over several axes exceeds 16; rewrite as fewer, larger tiles" in text
    assert "race" not in text and "conflict" not in text  # a limit of the verifier, not a proven bug


def test_diagonal_tiles_are_decided_without_a_raster(monkeypatch):
    from tilec.ir import regions

    src = """program diag(world W)
  dims M = 4096
  tiles BM = 64
  in  X : f32[M, M]
  out D : f32[M, M]
  buf T : f32[M, M]
  stage a over m in M by BM, n in M by BM:
    D[m, n] = X[m, n]
  stage b over m in M by BM:
    T[m, m] = X[m, m]
"""
    monkeypatch.setattr(regions, "CELLS", 16)
    import tilec

    tilec.compile("diag.tile", world=2, schedule="bsp", source=src)


def test_a_program_at_fault_is_said_to_be_so():
    # two ranks (0 and 1 at world 3: rank // 2 is 0 for both) store the same rows of rank 0's B: the program races,
    # found before any schedule's pass ran
    src = """program p(world W)
  dims  M = 32, N = 16
  tiles BM = 16
  in  A : f32[M, N]
  out B : f32[M, N] symmetric
  stage s over m in M by BM:
    B@(rank // 2)[m, :] = A[m, :]
"""
    with pytest.raises(VerifyError) as info:
        tilec.compile("race.tile", world=3, schedule="bsp", source=src)
    text = str(info.value)
    assert text.startswith("race.tile:7:5: error: write conflict") and "on rank 0" in text, text
    assert text.endswith("note: the verifier rejected the program as written (after pass 'lower', before any "
                         "schedule's)"), text
