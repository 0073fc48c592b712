"""Peer expressions (`X@(rank + s)`, `X@(rank + 1)`) and `%` / `//` index pieces: the ring examples (a forwarded
ring all-gather, a ring AG+GEMM, a ring reduce-scatter, a direct ring, a neighbour exchange, a pipeline send, pairs)
compile under
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
MUST = {"ring_all_gather": {("bsp", "sm"), ("flags", "sm"), ("fused-push", "sm"), ("flags", "dma"),
                            ("fused-push", "dma")},
        "ring_ag_gemm": {("bsp", "sm"), ("flags", "sm"), ("fused-push", "sm"), ("specialized", "sm"),
                         ("flags", "dma"), ("fused-push", "dma")},
        "ring_direct": {("bsp", "sm"), ("flags", "sm"), ("fused-push", "sm"), ("specialized", "sm"),
                        ("flags", "dma"), ("fused-push", "dma")},
        "shift": {("bsp", "sm"), ("flags", "sm")},
        "send": {("bsp", "sm"), ("flags", "sm"), ("fused-push", "sm")},
        "pairs": {("bsp", "sm"), ("flags", "sm"), ("specialized", "sm")},
        "ring_reduce_scatter": {("bsp", "sm"), ("flags", "sm"), ("specialized", "sm"), ("flags", "dma")}}

# pairs of ranks swap their rows (a peer of a `%` piece), and `//` and `%` pieces place a rank's row
PAIRS = """program pairs(world W)
  dims  M = 16
  tiles BM = 16
  in  A : f32[M] symmetric
  out Y : f32[2*M]
  out Z : f32[(W + 1) // 2 * 2 * M]
  stage swap over m in M by BM:
    Y[((rank + 1) % 2) * M + m] = A@(rank + 1 - 2 * (rank % 2))[m]
  stage keep over m in M by BM:
    Y[(rank % 2) * M + m] = A[m]
  stage grp over m in M by BM:
    Z[((rank // 2) * 2 + rank % 2) * M + m] = A[m] * 3
"""

# a pipeline's send: every rank stores into its right neighbour's buffer, which that rank then reads
SEND = """program send(world W)
  dims  M = 64
  tiles BM = 16
  in  A : f32[M]
  out Y : f32[M]
  buf X : f32[M] symmetric
  stage send over m in M by BM:
    X@(rank + 1)[m] = A[m] * 2
  barrier
  stage recv over m in M by BM:
    Y[m] = X[m] + 1
"""

# the ring in the other direction, without forwarding: step s reads rank r + s's rows straight from it
RING_DIRECT = """program ring_direct(world W)
  dims  M = 256, N = 192, K = 128
  tiles BM = 64, BN = 64, BK = 32
  in  A  : f16[M/W, K] symmetric
  in  B  : f16[K, N]
  out C  : f16[M, N]
  buf Ag : f16[M, K] symmetric
  stage ring over s in ranks, m in M/W by BM, k in K by BK:
    Ag[((rank + s) % W) * M/W + m, k] = A@(rank + s)[m, k]
  barrier
  stage gemm over s in ranks, m in M/W by BM, n in N by BN:
    C[((rank + s) % W) * M/W + m, n] = sum k in K by BK: Ag[((rank + s) % W) * M/W + m, k] @ B[k, n]
"""
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
    if name in ("shift", "ring_direct", "send", "pairs"):
        return tilec.compile(f"tests/{name}.tile", world=world, schedule=schedule, transport=transport, dims=dims,
                             source={"shift": SHIFT, "ring_direct": RING_DIRECT, "send": SEND, "pairs": PAIRS}[name])
    return tilec.compile(f"examples/{name}.tile", world=world, schedule=schedule, transport=transport, dims=dims)


def _cases(world):
    m = 16 * world  # one tile per chunk: the CPU emulation runs every step's kernels
    g = torch.Generator().manual_seed(world)
    a = [torch.randn(m // world, 32, generator=g).half() for _ in range(world)]
    b = torch.randn(32, 32, generator=g).half()
    full = torch.cat([x.float() for x in a])
    x = [torch.randn(64, generator=g) for _ in range(world)]
    p = [torch.randn(m, 16, generator=g) for _ in range(world)]
    total = sum(p)
    progs = {
        "ring_all_gather": ({"M": m, "K": 32, "BM": 16, "BK": 32}, [{"A": a[r]} for r in range(world)],
                            [{"Ag": full} for _ in range(world)]),
        "ring_ag_gemm": ({"M": m, "N": 32, "K": 32, "BM": 16, "BN": 32, "BK": 16},
                         [{"A": a[r], "B": b} for r in range(world)], [{"C": full @ b.float()} for _ in range(world)]),
        "ring_direct": ({"M": m, "N": 32, "K": 32, "BM": 16, "BN": 32, "BK": 32},
                        [{"A": a[r], "B": b} for r in range(world)], [{"C": full @ b.float()} for _ in range(world)]),
        "shift": ({}, [{"A": x[r]} for r in range(world)],
                  [{"Y": 2 * (x[(r + 1) % world] + x[(r - 1) % world])} for r in range(world)]),
        "send": ({}, [{"A": x[r]} for r in range(world)], [{"Y": 2 * x[(r - 1) % world] + 1} for r in range(world)]),
        "ring_reduce_scatter": ({"M": m, "N": 16, "BM": 16, "BN": 16}, [{"P": p[r]} for r in range(world)],
                                [{"R": total[16 * r:16 * r + 16]} for r in range(world)]),
        "pairs": ({}, [{"A": x[r][:16]} for r in range(world)],
                  [{"Y": torch.cat([x[r][:16], x[(r + 1 - 2 * (r % 2)) % world][:16]][:: 1 if r % 2 == 0 else -1]),
                    "Z": (slice(16 * r, 16 * r + 16), 3 * x[r][:16])} for r in range(world)]),
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
            cases.append((key, prog, [inputs], ()))
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
                    got = out[tname].float()
                    if isinstance(ref, tuple):  # (the elements the program writes, their values)
                        got, ref = got[ref[0]], ref[1]
                    err = (got - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                    assert err < 2e-2, (rank, key, tname, err)


def test_every_schedule_applies_or_says_why():
    """A schedule that does not apply to a ring program says why (`tilec check` lists it)."""
    for name in ("ring_all_gather", "ring_ag_gemm", "ring_direct"):
        for sched in SCHEDULES:
            try:
                _compile(name, 4, sched, "sm", None)
            except ScheduleError as e:
                assert f"{sched} does not apply: " in str(e) and len(str(e)) > 40, str(e)
    with pytest.raises(ScheduleError, match="through a peer expression of 's'"):
        _compile("ring_direct", 4, "fused-pull", "sm", None)
    with pytest.raises(ScheduleError, match="transport=dma needs flags"):
        _compile("ring_ag_gemm", 4, "bsp", "dma", None)


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


def test_a_ring_step_waits_on_the_chunk_its_neighbour_received():
    """ring_ag_gemm under flags at world 4: ring step s waits on one counter of its left neighbour's step s - 1
    (the chunk it forwards), and GEMM step s on the one ring step that brought its chunk, never on every peer."""
    prog = _compile("ring_ag_gemm", 4, "flags", "sm", None)
    g = prog.graph
    for s in range(3):
        (w,) = waits(g, f"ring_{s}")
        assert w.producer == ("own" if s == 0 else f"ring_{s - 1}")
        peer = {v.name: v.derived for v in stage(g, f"ring_{s}").loops if v.derived is not None}[w.read.rank]
        assert [peer.ranks({"rank": [r]}) for r in range(4)] == [{(r - 1) % 4} for r in range(4)]
    for s in range(4):
        (w,) = waits(g, f"gemm_{s}")
        assert w.read.rank == "rank" and w.producer == ("own" if s == 0 else f"ring_{s - 1}")
    src = prog.source
    assert "td.wait(F_Ag_ring_0 + lo // 64, epoch * 4, rank, _peer0," in src and "_peer0 = (rank + 3) % 4" in src


def _error(body: str, world: int = 4) -> str:
    src = SHIFT.replace("Y[m] = X@(rank + 1)[m] + X@(rank - 1)[m]", body)
    with pytest.raises(CompileError) as e:
        tilec.compile("tests/bad.tile", world=world, schedule="bsp", source=src)
    return str(e.value)


def test_peers_that_are_not_affine_are_located_errors():
    msg = _error("Y[m] = X@(rank * rank)[m]")
    assert "tests/bad.tile:11:15: error: peer 'rank * rank' is not affine" in msg
    msg = _error("Y[m] = X@(rank + m)[m]")
    assert "tests/bad.tile:11:15:" in msg and "'m', which is not `rank`, a rank loop variable or a unit-step" in msg


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


TWO_WRITERS = """program two(world W)
  dims  M = 64
  tiles BM = 16
  in  A : f32[M] symmetric
  out Y : f32[2*M]
  buf X : f32[2*M] symmetric
  stage own over m in M by BM:
    X[m] = A[m]
  barrier
  stage ring over s in 1 by 1, m in M by BM:
    X[M + m] = X@(rank + 1)[m]
  barrier
  stage use over m in 2*M by BM:
    Y[m] = X[m]
"""


def test_a_read_across_two_ring_writers_is_refused_under_flags():
    """`use` reads X[m] over both halves, which `own` and the ring's step write: one read, two producers. bsp runs
    it; flags refuses it, located, as a flag orders one producer."""
    tilec.compile("tests/two.tile", world=2, schedule="bsp", source=TWO_WRITERS)
    with pytest.raises(ScheduleError) as e:
        tilec.compile("tests/two.tile", world=2, schedule="flags", source=TWO_WRITERS)
    assert "stage 'use' (tests/two.tile:14:12) reads X[m], which reaches the elements of stages 'own' and" \
           " 'ring_0'" in str(e.value)


def test_a_peer_in_a_key_fixes_its_step_and_a_push_inverts_it():
    """peers.known_from: the counter's holder and a peer `rank + s` known, `s` is (one producer task per counter);
    peers.transpose: the pull `A@(rank + s)` becomes the push by that peer to (rank - s), the rank that pulled."""
    from tilec.ir.peers import known_from, transpose
    from tilec.ir.types import Var

    w = 4
    p = Var("_peer0", "peer", 1, 1, None, derived=Piece.make({"rank": 1, "s": 1}, 0, "%", w))
    dom = {"s": Var("s", "rank", w, 1, None), "m": Var("m", "tile", 64, 16, None), "_peer0": p,
           "rank": Var("rank", "me", w, 1, None)}
    assert known_from({"_peer0", "rank"}, dom) == {"_peer0", "rank", "s"}
    assert "s" not in known_from({"_peer0"}, dom)
    two = Var("_peer0", "peer", 1, 1, None, derived=Piece.make({"rank": 1, "s": 2}, 0, "%", w))
    assert "s" not in known_from({"_peer0", "rank"}, dom | {"_peer0": two})  # 2*s does not step through every rank
    loops = transpose((dom["s"], dom["m"], p), "_peer0", w)
    (q,) = [v for v in loops if v.derived is not None]
    for r in range(w):  # on rank r (the old peer), the new `_peer0` is the rank that pulled from it
        for s in range(w):
            assert q.derived.evaluate({"rank": r, "s": s}) == (r - s) % w


def test_the_cost_model_ranks_the_ring_programs():
    """tilec.perf.auto.rank_schedules predicts a time for every schedule that applies to the ring programs (what
    `--schedule auto` picks from), beside the one-shot AG+GEMM; docs/language.md says which it predicts wins."""
    import math

    from tilec.perf.auto import rank_schedules

    dims = {"M": 512, "N": 256, "K": 256, "BM": 128, "BN": 128, "BK": 64}
    ring = dict(rank_schedules(f"{ROOT}/examples/ring_ag_gemm.tile", 2, dims))
    one_shot = dict(rank_schedules(f"{ROOT}/examples/ag_gemm.tile", 2, dims))
    rs = dict(rank_schedules(f"{ROOT}/examples/ring_reduce_scatter.tile", 2, {"M": 512, "N": 256}))
    for ranked in (ring, one_shot, rs):
        assert {"bsp", "flags"} <= set(ranked) and all(math.isfinite(t) and t > 0 for t in ranked.values()), ranked
    assert "fused-push" in ring and "fused-pull" not in ring


def test_a_stage_reading_what_it_writes_needs_its_steps_first():
    """Only a stage over steps first may read the tensor it writes (step s reads step s - 1): elsewhere it is the
    located race it always was, saying how to write a ring."""
    src = TWO_WRITERS.replace("stage ring over s in 1 by 1, m in M by BM:", "stage ring over m in M by BM:") \
        .replace("X[M + m] = X@(rank + 1)[m]", "X[M + m] = X@(rank + 1)[m] + X[m]")
    with pytest.raises(CompileError) as e:
        tilec.compile("tests/two.tile", world=2, schedule="bsp", source=src)
    assert "tests/two.tile:11:16: error: stage 'ring' reads 'X', which it also writes" in str(e.value)
    assert "loop over steps first" in str(e.value)
