"""Peer expressions (`X@(rank + s)`, `X@(rank + 1)`) and `%` / `//` index pieces: the ring examples compile under
every schedule that applies (the others say why), verify, and match torch on 1-4 CPU ranks; one ring step waits on
its one neighbour's flag; peers that are not affine, `%` by a variable and `//` pieces that split a tile are
located errors; the peer algebra (tilec/ir/peers.py) on its own."""

from pathlib import Path

import pytest
import torch

import tilec
from tilec.errors import CompileError, ScheduleError
from tilec.ir.graph import stage, waits
from tilec.ir.peers import Piece
from tilec.passes.schedules import SCHEDULES
from tilec.runtime import spawn

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = [(s, "sm") for s in SCHEDULES] + [("flags", "dma"), ("fused-push", "dma")]
# what must apply, per example, at a world of more than one rank (the rest may refuse, saying why)
MUST = {"ring_all_gather": {("bsp", "sm"), ("flags", "sm")},
        "ring_ag_gemm": {("bsp", "sm"), ("flags", "sm"), ("fused-push", "sm"), ("specialized", "sm"),
                         ("flags", "dma"), ("fused-push", "dma")},
        "shift": {("bsp", "sm"), ("flags", "sm")}}

SHIFT = """program shift(world W)
  dims  M = 64
  tiles BM = 16
  in  A : f32[M]
  out Y : f32[M]
  buf X : f32[M] symmetric
  stage scale over m in M by BM:
    X[m] = A[m] * 2
  barrier
  stage shift over m in M by BM:
    Y[m] = X@(rank + 1)[m] + X@(rank - 1)[m]
"""


def _compile(name, world, schedule, transport, dims):
    if name == "shift":
        return tilec.compile("tests/shift.tile", world=world, schedule=schedule, transport=transport, dims=dims,
                             source=SHIFT)
    return tilec.compile(f"examples/{name}.tile", world=world, schedule=schedule, transport=transport, dims=dims)


def _cases(world):
    m = 32 * world
    g = torch.Generator().manual_seed(world)
    a = [torch.randn(m // world, 32, generator=g).half() for _ in range(world)]
    b = torch.randn(32, 32, generator=g).half()
    full = torch.cat([x.float() for x in a])
    x = [torch.randn(64, generator=g) for _ in range(world)]
    progs = {
        "ring_all_gather": ({"M": m, "K": 32, "BM": 16, "BK": 16}, [{"A": a[r]} for r in range(world)],
                            [{"Ag": full} for _ in range(world)]),
        "ring_ag_gemm": ({"M": m, "N": 32, "K": 32, "BM": 16, "BN": 16, "BK": 16},
                         [{"A": a[r], "B": b} for r in range(world)], [{"C": full @ b.float()} for _ in range(world)]),
        "shift": ({}, [{"A": x[r]} for r in range(world)],
                  [{"Y": 2 * (x[(r + 1) % world] + x[(r - 1) % world])} for r in range(world)]),
    }
    cases, want, refused = [], {}, {}
    for name, (dims, inputs, outs) in progs.items():
        for sched, transport in VARIANTS:
            try:
                prog = _compile(name, world, sched, transport, dims)
            except ScheduleError as e:
                refused[(name, sched, transport)] = str(e)
                continue
            key = (name, sched, transport)
            cases.append((key, prog, [inputs, inputs], ()))
            want[key] = outs
    return cases, want, refused


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_programs_match_torch(world):
    cases, want, refused = _cases(world)
    for name, must in MUST.items():
        ran = {(s, t) for (n, s, t) in want if n == name}
        assert must <= ran or world == 1, (name, must - ran, refused)
    for (_name, sched, _t), why in refused.items():
        assert why.strip() and (sched in why or "transport" in why), why  # a reason naming the schedule
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 22, timeout=300)
    for rank, res in enumerate(got):
        for key, calls in res.items():
            for out in calls:
                for tname, ref in want[key][rank].items():
                    err = (out[tname].float() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                    assert err < 2e-2, (rank, key, tname, err)


def test_every_schedule_applies_or_says_why():
    """`tilec check` lists a reason per schedule that does not apply; the ring programs' refusals name the stage."""
    for name in ("ring_all_gather", "ring_ag_gemm"):
        for sched in SCHEDULES:
            try:
                _compile(name, 4, sched, "sm", None)
            except ScheduleError as e:
                assert sched in str(e) and "does not apply" in str(e), str(e)
    with pytest.raises(ScheduleError, match="peer expression of 's'"):
        _compile("ring_ag_gemm", 4, "fused-pull", "sm", None)


def test_a_neighbour_read_waits_on_exactly_one_peer():
    """`X@(rank + 1)[m]` under flags: one wait per read, on the counters of the one rank (rank + 1) % W holds."""
    prog = _compile("shift", 4, "flags", "sm", None)
    ws = [w for w in waits(prog.graph, "shift")]
    assert len(ws) == 2, ws
    st = stage(prog.graph, "shift")
    derived = {v.name: v.derived for v in st.loops if v.derived is not None}
    for w in ws:
        p = derived[w.read.rank]
        for r in range(4):
            assert p.ranks({"rank": [r]}) == {(r + 1) % 4} or p.ranks({"rank": [r]}) == {(r - 1) % 4}
    src = prog.source
    assert "_peer0 = (rank + 1) % 4" in src and "_peer1 = (rank + 3) % 4" in src
    shift_waits = [ln for ln in src.splitlines() if "td.wait(F_X_scale" in ln]
    assert len(shift_waits) == 2 and all(", _peer0, " in ln or ", _peer1, " in ln for ln in shift_waits), shift_waits


def test_a_ring_step_waits_on_the_chunk_of_its_step():
    """ring_ag_gemm under flags: step s of the GEMM waits on the rows of Ag its step s copied (one chunk of one
    neighbour), not on every peer's rows: the counter it polls is that chunk's."""
    prog = _compile("ring_ag_gemm", 4, "flags", "sm", None)
    (w,) = waits(prog.graph, "gemm")
    assert w.read.rank == "rank"  # the chunk is local: the copy stage of this rank fetched it
    assert str(w.read) == "Ag[64*_peer0 + m, k]"  # its rows: the chunk of peer (rank + s) % W
    assert "_peer0 = (rank + s) % 4" in prog.source


def _error(body: str, world: int = 4) -> str:
    src = SHIFT.replace("Y[m] = X@(rank + 1)[m] + X@(rank - 1)[m]", body)
    with pytest.raises(CompileError) as e:
        tilec.compile("tests/bad.tile", world=world, schedule="bsp", source=src)
    return str(e.value)


def test_peers_that_are_not_affine_are_located_errors():
    msg = _error("Y[m] = X@(rank * rank)[m]")
    assert "tests/bad.tile:11:15: error: peer 'rank * rank' is not affine" in msg
    msg = _error("Y[m] = X@(rank + m)[m]")
    assert "tests/bad.tile:11:15:" in msg and "'m', which is not `rank` or a rank loop variable" in msg


def test_remainder_by_a_variable_is_a_located_error():
    msg = _error("Y[m] = A[(rank + 1) % m]")
    assert "tests/bad.tile:11:14: error: index is not affine: '%' by a loop variable" in msg


def test_a_floor_piece_that_splits_a_tile_is_a_located_error():
    msg = _error("Y[m] = A[(m + 16) // 2]")
    assert "tests/bad.tile:11:14:" in msg and "is not tile-aligned" in msg and "'m'" in msg


def test_peer_algebra():
    w = 4
    a = Piece.make({"rank": 1}, w - 1, "%", w)
    b = Piece.make({"rank": 1}, -1, "%", w)
    assert a == b and str(a) == "(rank + 3) % 4"
    assert [a.evaluate({"rank": r}) for r in range(w)] == [3, 0, 1, 2]
    p = Piece.make({"rank": 1, "s": 1}, 1, "%", w)
    assert p.ranks({"rank": [2], "s": range(w)}) == set(range(w))
    assert p.ranks({"rank": [2], "s": [0]}) == {3}
    assert p.inverts("s") and not Piece.make({"s": 2}, 0, "%", w).inverts("s")
    q = Piece.make({"rank": 1}, 3, "//", 2)
    assert q.reach({"rank": (0, 3)}) == (1, 3) and q.evaluate({"rank": 3}) == 3
