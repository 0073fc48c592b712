"""Each rule of the verifier alone (tilec/passes/verify/<rule>.py), on a small hand-written program: its graph
after a schedule passes the rule, one hand-made break makes the rule report it (located, of the rule's kind),
and the whole verifier then says so too. Rules run after the ones they read facts from (structure sets the
graph's facts up; waits reads what reads and flags found)."""

from __future__ import annotations

import dataclasses

import pytest

from tilec.errors import VerifyError
from tilec.frontend.parser import parse
from tilec.frontend.sema import check
from tilec.ir.graph import Barrier, Kernel, Wait, copy_graph, sid, stage, state_of, update_state
from tilec.ir.types import Affine
from tilec.passes.base import run_pipeline
from tilec.passes.lower import Lower
from tilec.passes.schedules import pipeline
from tilec.passes.verify import (
    accesses,
    barriers,
    deadlock,
    flags,
    folds,
    kernels,
    reads,
    structure,
    transport,
    verify,
    waits,
    writes,
)
from tilec.passes.verify.context import Ctx

SMALL = """program small(world W)
  dims  M = 16, N = 8
  tiles BM = 8, BN = 8
  in  A  : f32[M/W, N] symmetric
  out C  : f32[M, N]
  buf Ag : f32[M, N] symmetric
  stage gather over r in ranks, m in M/W by BM, n in N by BN:
    Ag[r*M/W + m, n] = A@r[m, n]
  barrier
  stage scale over m in M by BM, n in N by BN:
    C[m, n] = Ag[m, n] * 2
"""

BEFORE = {"waits": (reads, flags), "folds": (flags,)}  # rules whose facts a rule reads


@pytest.fixture(scope="module")
def graphs():
    g0 = Lower()(check(parse(SMALL, "small.tile"), 2))
    verify(g0, "lower")
    out = {"lower": g0}
    for s in ("bsp", "flags"):
        out[s] = run_pipeline(copy_graph(g0), pipeline(s, "tile"), verify)
    return out


def rule_problems(g, rule, name: str) -> list:
    """The problems `rule` alone finds in graph g (after structure, and the rules it reads facts from)."""
    ctx = Ctx(g)
    structure.check(ctx)
    assert not ctx.problems, ctx.problems
    for before in BEFORE.get(name, ()):
        before.check(ctx)
    ctx.problems.clear()
    ctx.rule = name
    rule.check(ctx)
    return ctx.problems


def expect(g, rule, name: str, text: str, line: int | None = None) -> None:
    got = rule_problems(g, rule, name)
    hit = [d for d in got if text in d.message]
    assert hit, (text, [d.message for d in got])
    assert all(d.kind == name and d.loc.file == "small.tile" for d in got)
    if line is not None:
        assert hit[0].loc.line == line, hit[0]
    with pytest.raises(VerifyError) as e:  # and the whole verifier reports it, of the same kind
        verify(g, "test")
    assert any(text in d.message and d.kind in (name, "structure", "accesses") for d in e.value.diagnostics)


ALL = [("structure", structure), ("accesses", accesses), ("barriers", barriers), ("kernels", kernels),
       ("transport", transport), ("writes", writes), ("reads", reads), ("flags", flags), ("waits", waits),
       ("folds", folds), ("deadlock", deadlock)]


@pytest.mark.parametrize("schedule", ["lower", "bsp", "flags"])
@pytest.mark.parametrize("name,rule", ALL, ids=[n for n, _ in ALL])
def test_every_rule_passes_the_sound_graph(graphs, schedule, name, rule):
    assert rule_problems(copy_graph(graphs[schedule]), rule, name) == []


def test_structure_names_an_order_that_is_not_the_graphs(graphs):
    g = copy_graph(graphs["bsp"])
    update_state(g, order=(*state_of(g).order, "s:ghost"))
    ctx = Ctx(g)
    structure.check(ctx)
    (d,) = ctx.problems
    assert d.kind == "structure" and "program order names 's:ghost'" in d.message and d.loc.line == 0


def _shift_store(g, name: str, d: int, by: int):
    s = stage(g, name)
    st = s.body[0]
    idx = list(st.access.index)
    idx[d] = Affine(idx[d].terms, idx[d].const + by)
    g.nodes[sid(name)]["payload"] = dataclasses.replace(
        s, body=(dataclasses.replace(st, access=dataclasses.replace(st.access, index=tuple(idx))),))


def test_accesses_finds_a_store_out_of_bounds(graphs):
    g = copy_graph(graphs["bsp"])
    _shift_store(g, "scale", 0, 4)
    expect(g, accesses, "accesses", "out of bounds: dim 0 of 'C' reaches [4, 19] but its size is 16", line=11)


def test_barriers_finds_a_barrier_left_under_flags(graphs):
    g = copy_graph(graphs["flags"])
    g.add_node("b:9", kind="barrier", payload=Barrier(9, stage(g, "scale").loc))
    update_state(g, order=(state_of(g).order[0], "b:9", *state_of(g).order[1:]))
    expect(g, barriers, "barriers", "a global barrier is left after replace-barriers")


def test_kernels_finds_stages_out_of_program_order(graphs):
    g = copy_graph(graphs["bsp"])
    update_state(g, kernels=tuple(reversed(state_of(g).kernels)))
    expect(g, kernels, "kernels", "kernels run the stages in the order scale, gather, not in program order")


def test_transport_finds_an_unknown_mover(graphs):
    g = copy_graph(graphs["bsp"])
    s = stage(g, "gather")
    g.nodes[sid("gather")]["payload"] = dataclasses.replace(s, transport="nvlink")
    expect(g, transport, "transport", "stage 'gather' has transport 'nvlink', neither 'sm' nor 'dma'", line=7)


def test_writes_finds_tasks_storing_one_element(graphs):
    g = copy_graph(graphs["lower"])
    s = stage(g, "gather")
    st = s.body[0]
    # drop `r*M/W` from the row: the ranks' copies of one shard land on the same rows
    idx = (Affine((("m", 1),), 0), st.access.index[1])
    g.nodes[sid("gather")]["payload"] = dataclasses.replace(
        s, body=(dataclasses.replace(st, access=dataclasses.replace(st.access, index=idx)),))
    expect(g, writes, "writes", "write conflict: tasks of stage 'gather' store Ag[m, n] into the same element", 8)


def test_reads_finds_a_read_with_no_barrier(graphs):
    g = copy_graph(graphs["lower"])
    s = stage(g, "scale")
    st = s.body[0]
    # read the peer's copy: without the barrier nothing orders rank r's gather before this rank's read
    ld = st.value.args[0]
    far = dataclasses.replace(ld, access=dataclasses.replace(ld.access, rank="r"))
    g.nodes[sid("scale")]["payload"] = dataclasses.replace(
        s, loops=(*s.loops, next(v for v in stage(g, "gather").loops if v.is_rank)),
        body=(dataclasses.replace(st, value=dataclasses.replace(st.value, args=(far, *st.value.args[1:]))),))
    g.remove_node("b:0")
    update_state(g, order=tuple(n for n in state_of(g).order if n != "b:0"))
    expect(g, reads, "reads", "read before flag: stage 'scale' reads Ag@r[m, n] (written by stage 'gather')", 11)


def test_flags_finds_a_count_no_release_reaches(graphs):
    g = copy_graph(graphs["flags"])
    (n,) = [n for n, d in g.nodes(data=True) if d["kind"] == "flag"]
    f = g.nodes[n]["payload"]
    g.nodes[n]["payload"] = dataclasses.replace(f, count=f.count + 1)
    expect(g, flags, "flags", f"is released {f.count} time(s) per call, waits expect {f.count + 1}", line=7)


def test_waits_finds_a_wait_that_is_never_emitted(graphs):
    g = copy_graph(graphs["flags"])
    (n,) = [n for n, d in g.nodes(data=True) if d["kind"] == "flag"]
    (w,) = g.edges[n, sid("scale")]["waits"]
    m, k = w.read.index
    g.edges[n, sid("scale")]["waits"] = (dataclasses.replace(
        w, read=dataclasses.replace(w.read, index=(Affine(m.terms, m.const + 1), k))),)
    expect(g, waits, "waits", f"the wait on {w.flag} before Ag[m + 1, n] is never emitted", line=11)


def test_folds_finds_a_fold_list_of_something_else(graphs):
    g = copy_graph(graphs["flags"])
    update_state(g, folds=("not a fold",))
    expect(g, folds, "folds", "the fold list holds something that is not a fold")


def test_deadlock_finds_a_wait_on_a_later_stage(graphs):
    g = copy_graph(graphs["flags"])
    (n,) = [n for n, d in g.nodes(data=True) if d["kind"] == "flag"]
    f = g.nodes[n]["payload"]
    # gather waits on its own flag before reading its source: a task waiting for itself
    read = stage(g, "gather").body[0].access
    g.add_edge(n, sid("gather"), kind="wait", waits=(Wait(f.name, read, "gather", "Ag", f.loc),))
    expect(g, deadlock, "deadlock", f"stage 'gather' waits on its own flag {f.name}")


def test_kernel_payloads_are_kernels(graphs):
    """A kernel list holding something else is a structure problem, found before the kernels rule runs."""
    g = copy_graph(graphs["bsp"])
    update_state(g, kernels=(*state_of(g).kernels[:1], "k9"))
    assert isinstance(state_of(graphs["bsp"]).kernels[0], Kernel)
    ctx = Ctx(g)
    structure.check(ctx)
    assert [d.message for d in ctx.problems] == ["the kernel list holds something that is not a kernel"]


UNWRITTEN = """program unwritten(world W)
  dims  M = 16, N = 8
  tiles BM = 4, BN = 8
  in  X : f32[M, N]
  buf Y : f32[2*M, N]
  out Z : f32[M, N]
  stage a over m in M by BM, n in N by BN:
    Y[m, n] = X[m, n] * 2
  barrier
  stage b over m in M by BM, n in N by BN:
    Z[m, n] = Y[m, n] + Y[M + m, n]
"""


@pytest.mark.parametrize("cmd", ["check", "compile"])
def test_a_verifier_rejection_prints_like_a_parser_error_and_exits_2(cmd, tmp_path, capsys):
    from tilec.cli.commands import main

    p = tmp_path / "unwritten.tile"
    p.write_text(UNWRITTEN)
    rc = main([cmd, str(p), "-o", str(tmp_path / "out.py")] if cmd == "compile" else [cmd, str(p)])
    out, err = capsys.readouterr()
    text = out + err
    assert rc == 2, text
    head = f"{p}:11:25: error: stage 'b' reads Y[m + 16, n], but no earlier stage writes Y[16, 0] on rank 0"
    assert f"{head}\n      Z[m, n] = Y[m, n] + Y[M + m, n]\n                          ^^^^^^^^^^^" in text, text
    assert "verifier failed" not in text
