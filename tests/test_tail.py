"""The short tail after flash decode's stream: one flag per producer tile (replace-barriers shares a flag between
the stores of one task), checked by the verifier on broken copies."""

from __future__ import annotations

import dataclasses

import pytest

import tilec
from tilec.errors import VerifyError
from tilec.ir.graph import copy_graph, flags
from tilec.ir.types import Affine
from tilec.passes.verify import verify

EXAMPLE = "examples/flash_decode.tile"


@pytest.fixture(scope="module")
def fd():
    return tilec.compile(EXAMPLE, world=2, schedule="fused-push")


@pytest.fixture(scope="module")
def fl():
    return tilec.compile(EXAMPLE, world=2, schedule="flags")  # no fold: every flag is waited on


def problems(g) -> str:
    with pytest.raises(VerifyError) as info:
        verify(g, "test")
    return "; ".join(info.value.problems)


def test_one_flag_per_producer_tile(fl):
    names = [f.name for f in flags(fl.graph)]
    assert names == ["Og+Lg.exchange", "Ol+Ll.local", "Os+Ls.split"]
    src = fl.source
    assert src.count("td.release(") == 3  # one per producing task, not one per tensor
    assert src.count("td.wait_all(F_Os_Ls_split") == 1  # the Ls read is covered by the wait before the Os read


def _set(g, name, **changes):
    g.nodes[f"f:{name}"]["payload"] = dataclasses.replace(g.nodes[f"f:{name}"]["payload"], **changes)


def test_shared_flag_with_another_release_pattern_is_rejected(fl):
    g = copy_graph(fl.graph)
    f = g.nodes["f:Os+Ls.split"]["payload"]
    (ls, key), = f.also
    # the Ls store counted per (b, g) only: its counters are not the ones the single release bumps
    _set(g, "Os+Ls.split", also=((ls, tuple(k for k in key if k not in ("j", "q"))),))
    assert "flag Os+Ls.split has 16 counters but its key (b, g) makes 4" in problems(g)


def test_shared_flag_of_a_store_the_producer_does_not_make_is_rejected(fl):
    g = copy_graph(fl.graph)
    f = g.nodes["f:Os+Ls.split"]["payload"]
    (ls, key), = f.also
    shifted = dataclasses.replace(ls, index=(ls.index[0], ls.index[1], Affine(ls.index[2].terms, 1)))
    _set(g, "Os+Ls.split", also=((shifted, key),))
    assert "which stage 'split' does not make" in problems(g)


def test_wait_on_a_shared_flag_for_a_tensor_it_does_not_count_is_rejected(fl):
    g = copy_graph(fl.graph)
    _set(g, "Os+Ls.split", also=())  # Ls reads still wait on it
    assert "a flag of 'Os', before reading Ls" in problems(g)


TRANSPOSED = """
program transposed(world W)
  dims  M = 4, N = 4
  in  X : f32[M, N]
  out C : f32[M, N]
  buf A : f32[M, N]
  buf B : f32[N, M]
  stage make over i in M by 1, j in N by 1:
    A[i, j] = X[i, j]
    B[j, i] = X[i, j]
  barrier
  stage use over i in M by 1, j in N by 1:
    C[i, j] = A[i, j] + B[j, i]
"""


def test_stores_counted_in_other_orders_keep_their_own_flags():
    prog = tilec.compile("transposed.tile", world=1, schedule="flags", source=TRANSPOSED)
    assert [f.name for f in flags(prog.graph)] == ["A.make", "B.make"]
    # sharing them anyway: the one release (A's counter i*4 + j) is not B's (j*4 + i)
    g = copy_graph(prog.graph)
    a, b = (g.nodes[f"f:{n}"]["payload"] for n in ("A.make", "B.make"))
    _set(g, "A.make", also=((b.write, b.key),))
    for _, c, d in list(g.out_edges("f:B.make", data=True)):
        ws = tuple(dataclasses.replace(w, flag="A.make") for w in d["waits"])
        g.edges["f:A.make", c]["waits"] += ws
    g.remove_node("f:B.make")
    assert "one release per task does not bump the same counter for both" in problems(g)


# -- fold-last: flash decode's local merge (and its push) run by the split task that completes a head ----------------

FD_CASES = {1: dict(B=3, HKV=2, G=2, D=16, S=32, BS=8), 2: dict(B=3, HKV=1, G=4, D=16, S=32, BS=16),
            3: dict(B=3, HKV=1, G=2, D=16, S=16, BS=8)}  # lens end inside rank 0's block, one is 0 (fd_workers)


def test_flash_decode_folds_the_local_merge(fd):
    from tilec.ir.graph import folds

    assert [(f.consumer, f.producer) for f in folds(fd.graph)] == [("local", "split"), ("exchange", "local")]
    k = fd.module.KERNELS[0]
    assert k[1] == 2 * 2 * 4 + 2 * 8  # split and combine tasks only: local and exchange left the loop
    split = fd.source[fd.source.index("def split_task("):fd.source.index("def local_task(")]
    assert "if td.arrive(F_Os_Ls_split_local + " in split and "local_task(" in split
    assert "td.wait" not in fd.source[fd.source.index("def local_task("):fd.source.index("def exchange_task(")]


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(FD_CASES))
def test_folded_flash_decode_matches_torch(world, monkeypatch):
    import math

    from tilec.runtime import spawn

    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.3")  # a late rank: peers reach their waits first
    cases = []
    for sched in ("fused-push", "specialized"):
        prog = tilec.compile(EXAMPLE, world=world, schedule=sched, dims=FD_CASES[world])
        assert prog.graph.graph.get("folds"), sched
        cases.append((prog, "f16", 7 * world))
    results = spawn("tests.fd_workers:run_cases", world, args=(cases, 3), heap_bytes=1 << 22, timeout=600)
    bad = [row for rows in results for row in rows if not all(math.isfinite(e) and e <= 2e-3 for e in row[3])]
    assert not bad, bad
    assert all(row[4] for rows in results for row in rows)  # every counter (arrivals too) at epoch * count
