"""transport=dma: every flag counter is set by one chunk of one rank (a copy engine sets a counter to the call's
epoch; it cannot add to it), whatever the granularity, and every store of a copy stage lands before its counter.

The class: a push copy on the copy engines whose flag counts several senders' tiles with one counter (granularity
tensor: one counter per peer for every sender) let readers go as soon as the first sender's chunk landed (stale
values, or NaN where nothing was written yet); a flag shared by two stores of one copy stage put the second
store's copies in a chunk of no counter. The plans are checked here for every push program, granularity and world
2-4; a run against torch under the adversary is in the slow selection (the generated programs' default run has
the class too: fused-push+dma and flags+dma rows with granularity tensor)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import tilec
from tests import _workers
from tests._util import compile_example, compile_program, make_calls, rel_err
from tests.test_dma import _ag_rows
from tests.test_new_programs import all_to_all, all_to_all_offset, push_scale
from tilec.codegen.dma import dma_table
from tilec.errors import ScheduleError
from tilec.ir.graph import copy_graph, dma_stages, flags
from tilec.ir.types import ME, Affine
from tilec.passes.transport import one_sender

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

GRANULARITIES = ("auto", "tile", "rank", "tensor")

# two copies in one stage: replace-barriers shares one flag between them (Ag+Bg.gather)
TWO_GATHERS = """\
program two_gathers(world W)
  dims  M = 24, K = 12
  tiles BM = 8, BK = 8

  in  A  : f32[M/W, K] symmetric
  in  B  : f32[M/W, K] symmetric
  buf Ag : f32[M, K] symmetric
  buf Bg : f32[M, K] symmetric
  out C  : f32[M, K]

  stage gather over r in ranks, m in M/W by BM, k in K by BK:
    Ag[r*M/W + m, k] = A@r[m, k]
    Bg[r*M/W + m, k] = B@r[m, k]
  barrier
  stage add over m in M by BM, k in K by BK:
    C[m, k] = Ag[m, k] + Bg[m, k] * 2.0
"""


def two_gathers(ins, r):
    return {"C": torch.cat([d["A"].float() for d in ins]) + torch.cat([d["B"].float() for d in ins]) * 2}


def _push_programs(w: int, granularity: str):
    """(id, compiled) of every program whose copy stage pushes on the copy engines (ragged shapes)."""
    kw = {"transport": "dma", "granularity": granularity}
    return [("ag_gemm fused-push", compile_example(w, "fused-push", {"M": 11 * w, "N": 16, "K": 40, "BM": 8,
                                                                     "BK": 16}, **kw)),
            ("push_scale flags", compile_program("push_scale", w, "flags", {"M": 10 * w, "K": 20}, **kw)),
            ("push_scale fused-push", compile_program("push_scale", w, "fused-push", {"M": 10 * w, "K": 20}, **kw)),
            ("all_to_all fused-push", compile_program("all_to_all", w, "fused-push", {"M": 10 * w}, **kw)),
            ("all_to_all_offset fused-push", compile_program("all_to_all_offset", w, "fused-push", {"R": 9}, **kw))]


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_every_counter_of_a_push_is_set_by_one_rank(world, granularity):
    for what, prog in _push_programs(world, granularity):
        g = prog.graph
        pushes = {s.name for s in dma_stages(g) if any(st.access.rank != ME for st in s.body)}
        assert pushes, what
        for f in flags(g):
            if f.producer in pushes:  # the sender picks its counters
                assert ME in f.key and f.count == 1, (what, f)
        setters: dict[tuple, set[int]] = {}
        for q, chunks in dma_table(g).items():
            for param, counter, owner, copies in chunks:
                assert param is not None and copies, (what, q)
                setters.setdefault((param, counter, owner), set()).add(q)
                assert {c[1] for c in copies} == {q}, what  # a push copies this rank's tiles only
        assert all(len(qs) == 1 for qs in setters.values()), (what, setters)
        # each receiving rank's counters: one per sender that copies into it (its own copy read in place or not)
        for owner in range(world):
            senders = {q for (_p, _c, o), qs in setters.items() if o == owner for q in qs}
            assert senders >= set(range(world)) - {owner}, (what, owner, senders)


@pytest.mark.parametrize("schedule", ["flags", "specialized"])
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_a_flag_shared_by_two_stores_holds_both_stores_copies(schedule, granularity):
    """Every copy of both stores is in a chunk of a counter, and a chunk holds both tensors' tiles of its counter."""
    try:
        prog = tilec.compile("tests/generated/two_gathers.tile", 2, schedule, source=TWO_GATHERS, transport="dma",
                             granularity=granularity)
    except ScheduleError as e:
        assert schedule == "specialized", e
        return
    (f,) = flags(prog.graph)
    assert f.tensors == ("Ag", "Bg")
    for _q, chunks in dma_table(prog.graph).items():
        for param, _counter, _owner, copies in chunks:
            assert param is not None and {c[4] for c in copies} == {"Ag", "Bg"}, chunks


def test_a_plan_where_two_ranks_set_one_counter_is_refused():
    """The guard behind the pass: a push flag with one counter for every sender (what transport=dma made of
    granularity=tensor before) is a ScheduleError when the table is built, never a module."""
    prog = compile_example(3, "fused-push", {"M": 48, "N": 16, "K": 16, "BM": 16, "BK": 16}, transport="dma",
                           granularity="tensor")
    g = copy_graph(prog.graph)
    (f,) = flags(g)
    g.nodes[f"f:{f.name}"]["payload"] = replace(f, key=(), size=1)
    with pytest.raises(ScheduleError, match=r"ranks \d and \d would both set counter 0 of F_Ag_gather on rank \d"):
        dma_table(g)


def test_a_push_whose_index_does_not_name_the_sender_is_refused():
    prog = compile_example(2, "fused-push", {"M": 32, "N": 16, "K": 16, "BM": 16, "BK": 16}, transport="dma",
                           granularity="tensor")
    (f,) = flags(prog.graph)
    rows = Affine(tuple((v, k) for v, k in f.write.index[0].terms if v != ME), 0)
    blind = replace(f, key=(), write=replace(f.write, index=(rows, *f.write.index[1:])))
    with pytest.raises(ScheduleError, match="does not say which rank sent a tile"):
        one_sender(prog.graph, blind)


def _run_cases(w: int):
    ag = {"M": 11 * w, "N": 20, "K": 40, "BM": 8, "BN": 16, "BK": 16}
    return [("ag_gemm fused-push", lambda: compile_example(w, "fused-push", ag, transport="dma",
                                                           granularity="tensor"), _ag_rows, "C"),
            ("push_scale flags", lambda: compile_program("push_scale", w, "flags", {"M": 10 * w, "K": 20},
                                                         transport="dma", granularity="tensor"), push_scale, "C"),
            ("all_to_all fused-push", lambda: compile_program("all_to_all", w, "fused-push", {"M": 10 * w},
                                                              transport="dma", granularity="tensor"), all_to_all, "C"),
            ("all_to_all_offset fused-push", lambda: compile_program(
                "all_to_all_offset", w, "fused-push", {"R": 9}, transport="dma", granularity="tensor"),
             all_to_all_offset, "C"),
            ("two_gathers flags", lambda: tilec.compile("tests/generated/two_gathers.tile", w, "flags",
                                                        source=TWO_GATHERS, transport="dma"), two_gathers, "C")]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_granularity_tensor_on_the_copy_engines_matches_torch(world, monkeypatch):
    from tilec.runtime import spawn

    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.2")  # the copies start after the kernels; one rank later still
    batch, meta = [], {}
    for i, (cid, make, expect, out) in enumerate(_run_cases(world)):
        prog = make()
        calls = make_calls(prog, 2, seed=70 + 10 * world + i)
        batch.append((cid, prog, calls, ()))
        meta[cid] = (calls, expect, out)
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 23, timeout=600, args=(batch,))
    for cid, (calls, expect, out) in meta.items():
        for c, ins in enumerate(calls):
            for r in range(world):
                err = rel_err(results[r][cid][c][out], expect(ins, r)[out])
                assert err < 2e-2, f"{cid} world {world} rank {r} call {c + 1}: relative error {err:.3g}"
