"""Data-dependent rows (`X[idx[tok], :]`, `c in C by BC upto cnt[e]`) and the MoE example (examples/moe.tile) against
torch: gathers with ragged tiles and repeated rows, counted loops (empty, partial, full), the out-of-range error on
the device (the kernels run in the Triton interpreter) and in the reference interpreter, located compile errors,
the verifier's rule, and MoE dispatch/expert GEMM/combine at worlds 1-4 (top-k 1 and 2, empty experts, every token
to one expert, choices over capacity)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import tilec
from tilec import moe
from tilec.errors import CompileError, IndexRangeError, VerifyError
from tilec.frontend.parser import parse
from tilec.frontend.sema import check
from tilec.ir.gather import Gathered
from tilec.ir.graph import set_payload, sid, stage
from tilec.ir.types import Affine, Load, Store, Var, map_expr
from tilec.passes.base import run_pipeline
from tilec.passes.lower import Lower, program_graph
from tilec.passes.verify import verify
from tilec.reference import evaluate
from tilec.runtime import spawn

GATHER = """\
program gather(world W)
  dims  T = 40, N = 37, H = 24
  tiles BT = 16

  in  X   : f16[N, H]
  in  idx : i32[T]
  out Y   : f16[T, H]

  stage g over tok in T by BT:
    Y[tok, :] = X[idx[tok], :] * 2.0
"""

# a scatter: distinct rows, checked by every call; then a stage that reads them (under flags: after every task)
SCATTER = """\
program scatter(world W)
  dims  T = 40, N = 45, H = 24
  tiles BT = 16, BN = 16

  in  X   : f16[T, H]
  in  idx : i32[T]
  out Y   : f16[N, H]
  out Z   : f16[N, H]

  stage s over tok in T by BT:
    Y[idx[tok], :] = X[tok, :] * 2.0
  barrier
  stage z over n in N by BN:
    Z[n, :] = Y[n, :] + 1.0
"""

COUNTED = """\
program counted(world W)
  dims  E = 3, C = 40, H = 32
  tiles BC = 16

  in  X   : f16[E*C, H]
  in  cnt : i32[E]
  out Y   : f16[E*C, H]

  stage s over e in E by 1, c in C by BC upto cnt[e]:
    Y[e*C + c, :] = X[e*C + c, :] + 1.0
"""

# a gather of rows a stage computes: under flags its read waits for every producer tile of the dim
PRODUCED = """\
program produced(world W)
  dims  T = 24, N = 40, H = 16
  tiles BT = 8, BN = 16

  in  X   : f16[N, H]
  in  idx : i32[T]
  out Y   : f16[T, H]
  buf Z   : f16[N, H]

  stage a over n in N by BN:
    Z[n, :] = X[n, :] * 3.0
  barrier
  stage g over tok in T by BT:
    Y[tok, :] = Z[idx[tok], :]
"""

# a gather of a peer's computed rows: under flags it waits, chosen at run time, for the peer's tiles its rows lie in
PEER = """\
program peer(world W)
  dims  T = 16, N = 32, H = 16
  tiles BT = 8, BN = 8

  in  X   : f16[N, H]
  in  idx : i32[T]
  out Y   : f16[W*T, H]
  buf Z   : f16[N, H] symmetric

  stage a over n in N by BN:
    Z[n, :] = X[n, :] * 3.0
  barrier
  stage g over r in ranks, i in T by BT:
    Y[r*T + i, :] = Z@r[idx[i], :]
"""

H, F = 64, 64


def _compile(src: str, world: int = 1, schedule: str = "bsp", **dims):
    return tilec.compile(f"{src.split()[1].split('(')[0]}.tile", world=world, schedule=schedule, source=src,
                         dims=dims or None)


def _moe_case(world: int, tokens: int, el: int, cap: int, k: int, route: str, seed: int, h: int = H, f: int = F):
    """Inputs of one MoE call on every rank and the torch reference of every rank's output."""
    g = torch.Generator().manual_seed(seed)
    experts = world * el
    x = [torch.randn(tokens, h, generator=g).half() for _ in range(world)]
    w1 = [(torch.randn(el * h, f, generator=g) / 8).half() for _ in range(world)]
    w3 = [(torch.randn(el * h, f, generator=g) / 8).half() for _ in range(world)]
    w2 = [(torch.randn(el * f, h, generator=g) / 8).half() for _ in range(world)]
    if route == "one":  # every token's first choice is expert 0: it runs over capacity, the others are empty
        ids = [torch.stack([torch.tensor([0, *torch.randperm(experts - 1, generator=g)[:k - 1].add(1).tolist()])
                            for _ in range(tokens)]) for _ in range(world)]
    elif route == "skip_last":  # the last expert gets no token
        ids = [torch.stack([torch.randperm(experts - 1, generator=g)[:k] for _ in range(tokens)])
               for _ in range(world)]
    else:
        ids = [torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]) for _ in range(world)]
    wts = [torch.rand(tokens, k, generator=g) for _ in range(world)]
    rt = moe.route(ids, wts, el, cap)
    inputs = [{"X": x[r], "W1": w1[r], "W3": w3[r], "W2": w2[r], **rt[r]} for r in range(world)]
    return inputs, moe.reference(x, w1, w3, w2, ids, wts, el, cap), rt


def _close(got: torch.Tensor, want: torch.Tensor, what) -> None:
    err = float((got.float() - want).abs().max()) / max(1.0, float(want.abs().max()))
    assert err < 2e-2, (what, err)


# ---- compile time ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decl, use, where, phrase", [
    ("in  idx : f32[T]", "X[idx[tok], :]", "10:19", "row index 'idx' must be an i32 tensor, not f32"),
    ("in  idx : i32[T, 2]", "X[idx[tok, 0], :]", "10:19", "row index 'idx' must be 1-D, not 2-D"),
    ("buf idx : i32[T]", "X[idx[tok], :]", "10:19", "row index 'idx' must be an input ('in')"),
    ("in  idx : i32[T]", "X[idx[idx[tok]], :]", "10:19", "is itself indexed by a tensor: one level of indexing only"),
])
def test_bad_row_index_is_a_located_error(decl, use, where, phrase):
    src = GATHER.replace("in  idx : i32[T]", decl).replace("X[idx[tok], :]", use)
    with pytest.raises(CompileError) as info:
        _compile(src)
    text = info.value.render()
    assert f"gather.tile:{where}: error: " in text and phrase in text, text
    assert "^" in text.splitlines()[2]


def test_peer_scatter_and_bad_counts_are_located_errors():
    peer = SCATTER.replace("out Y   : f16[N, H]", "out Y   : f16[N, H] symmetric").replace(
        "over tok in T by BT", "over r in ranks, tok in T by BT").replace("Y[idx[tok], :]", "Y@r[idx[tok], :]")
    with pytest.raises(CompileError, match=r"scatter.tile:11:9: error: a scatter writes this rank's own copy of 'Y'"):
        _compile(peer, world=2)
    not_i32 = COUNTED.replace("in  cnt : i32[E]", "in  cnt : f16[E]")
    with pytest.raises(CompileError, match=r"counted.tile:9:47: error: row count 'cnt' must be an i32 tensor"):
        _compile(not_i32)
    past = COUNTED.replace("upto cnt[e]", "upto cnt[e + c]")  # c: its tile's first row, up to 32 here
    with pytest.raises(CompileError, match=r"counted.tile:9:51: error: index out of bounds: dim 0 of 'cnt' reaches"
                                           r" \[0, 41\] but its size is 3"):
        _compile(past)


def test_verifier_rejects_a_gather_narrower_than_its_dim():
    """The rows rule: a gathered dim must span its whole dim for every dependence (else the regions the other rules
    compare would miss rows the index may hit)."""
    bound = check(parse(PRODUCED, "produced.tile"), 1)
    g = run_pipeline(program_graph(bound), [Lower()], verify)
    s = stage(g, "g")
    (st,) = s.body

    rows16 = Var("_n", "tile", 16, 16, s.loc)  # a one-trip variable over rows 0..15 of Z's 40

    def narrow(e):
        if isinstance(e, Load) and isinstance(e.access, Gathered):
            a = e.access
            return dataclasses.replace(e, access=dataclasses.replace(
                a, index=(Affine((("_n", 1),), 0), *a.index[1:]), tile=("_n", *a.tile[1:])))
        return e

    bad = dataclasses.replace(s, loops=(*s.loops, rows16),
                              body=(Store(st.access, map_expr(st.value, narrow), st.loc),))
    set_payload(g, sid("g"), bad)
    with pytest.raises(VerifyError, match="does not span the whole dim"):
        verify(g, "mutated")


def test_reference_interpreter_scatters_distinct_rows():
    bound = check(parse(SCATTER, "scatter.tile"), 1)
    x = torch.randn(40, 24).half()
    perm = torch.randperm(45)[:40].to(torch.int32)
    y = evaluate(bound, [{"X": x, "idx": perm}])[0]["Y"]
    assert torch.equal(y[perm.long()], (x.float() * 2).half())
    perm[7] = perm[30]
    with pytest.raises(IndexRangeError, match=r"rows not distinct: idx\[30\] = \d+ names a row of dim 0 of 'Y'"):
        evaluate(bound, [{"X": x, "idx": perm}])


def test_emitted_gather_checks_and_masks_its_rows():
    src = _compile(GATHER).source
    assert re.search(r"idx_rows = tl\.load\(idx \+ rtok, mask=rtok < 40, other=0\)", src), src
    assert re.search(r"idx_ok = td\.rows_ok\(idx_rows, rtok, rtok < 40, 37, ERR, 1\)", src), src
    assert re.search(r"tl\.load\(X \+ .*idx_rows\[:, None\] \* 24.*mask=.*idx_ok\[:, None\]", src), src
    scattered = _compile(SCATTER).source
    assert "claimed = tl.atomic_xchg(_claims_Y + idx_rows * 24, epoch, mask=idx_ok)" in scattered, scattered
    assert "idx_once = td.rows_unique(claimed, idx_rows, rtok, idx_ok, epoch, ERR, 2)" in scattered
    counted = _compile(COUNTED).source
    assert "td.count_ok(cnt_val, e, 40, ERR, 1)" in counted and "mask=(rc < c_count)[:, None]" in counted
    assert "if c < c_count:  # rows below the count: compute and store them" in counted  # an empty block skips


def test_reference_interpreter_raises_on_an_index_out_of_range():
    bound = check(parse(GATHER, "gather.tile"), 1)
    idx = torch.arange(40, dtype=torch.int32) % 37
    idx[21] = -3
    with pytest.raises(IndexRangeError, match=r"index out of range: idx\[21\] = -3 is not a row of dim 0 of 'X'"
                                              r" \(0\.\.36\) at gather.tile:10:19"):
        evaluate(bound, [{"X": torch.zeros(37, 24).half(), "idx": idx}])


def test_moe_schedules():
    """The MoE layer: its gathers are no copies to fuse; bsp, flags and specialized verify at every world."""
    for world in (1, 2, 4):
        ok = [s for s in ("bsp", "flags", "fused-pull", "fused-push", "specialized")
              if _try(world, s)]
        assert {"bsp", "flags", "specialized"} <= set(ok), (world, ok)


def _try(world, sched) -> bool:
    try:
        tilec.compile("examples/moe.tile", world=world, schedule=sched)
        return True
    except tilec.errors.ScheduleError:
        return False


# ---- run time, one spawn per world --------------------------------------------------------------------------


def test_gathers_counts_and_moe_at_world_1():
    g = torch.Generator().manual_seed(3)
    cases, checks = [], {}
    # gather: ragged tiles (T=40 by 16, N=37), repeated rows; then an index out of range, then a good call again
    prog = _compile(GATHER)
    x = torch.randn(37, 24, generator=g).half()
    good = torch.randint(0, 37, (40,), generator=g, dtype=torch.int32)
    good[:5] = 36
    bad = good.clone()
    bad[37] = 812
    cases.append(("gather", prog, [[{"X": x, "idx": good}], [{"X": x, "idx": bad}], [{"X": x, "idx": good}]]))
    checks["gather"] = x.float()[good.long()] * 2
    # scatter: a permutation into more rows than it writes; then a repeated row; then the first again
    for sched in ("bsp", "flags"):
        prog = _compile(SCATTER, schedule=sched)
        x4 = torch.randn(40, 24, generator=g).half()
        perm = torch.randperm(45, generator=g)[:40].to(torch.int32)
        twice = perm.clone()
        twice[33] = perm[5]
        cases.append((f"scatter {sched}", prog, [[{"X": x4, "idx": perm}], [{"X": x4, "idx": twice}],
                                                 [{"X": x4, "idx": perm}]]))
        checks[f"scatter {sched}"] = (x4, perm, twice)
    # counted: an empty block, a partial one, a full one; then a count past its extent
    prog = _compile(COUNTED)
    x2 = torch.randn(120, 32, generator=g).half()
    cnt = torch.tensor([0, 17, 40], dtype=torch.int32)
    cases.append(("counted", prog, [[{"X": x2, "cnt": cnt}], [{"X": x2, "cnt": torch.tensor([1, 41, 2],
                                                                                          dtype=torch.int32)}]]))
    # a gather of rows an earlier stage computes (flags: it waits for all of them)
    prog = _compile(PRODUCED, schedule="flags")
    x3 = torch.randn(40, 16, generator=g).half()
    idx3 = torch.randint(0, 40, (24,), generator=g, dtype=torch.int32)
    cases.append(("produced", prog, [[{"X": x3, "idx": idx3}]]))
    checks["produced"] = (x3.float() * 3).half().float()[idx3.long()]
    # MoE at world 1: two experts, top-1 and top-2, every token to expert 0 (over capacity), an empty expert
    # (tokens, experts, capacity, top-k, routing, hidden, ffn): ragged tokens, capacity, hidden and ffn dims
    for key, (tokens, el, cap, k, route, h, f) in {"moe_top1": (20, 2, 16, 1, "any", H, F),
                                                   "moe_top2": (32, 2, 16, 2, "any", H, F),
                                                   "moe_one": (24, 2, 16, 1, "one", H, F),
                                                   "moe_empty": (16, 3, 16, 2, "skip_last", H, F),
                                                   "moe_ragged": (21, 3, 24, 2, "any", 48, 40)}.items():
        inputs, want, rt = _moe_case(1, tokens, el, cap, k, route, seed=len(cases), h=h, f=f)
        if route == "one":
            assert int(rt[0]["cnt"][0]) == cap and int(rt[0]["cnt"][1]) == 0  # over capacity, and an empty expert
        if route == "skip_last":
            assert int(rt[0]["cnt"][-1]) == 0
        prog = tilec.compile("examples/moe.tile", world=1, schedule="bsp",
                             dims={"T": tokens, "EL": el, "C": cap, "K": k, "H": h, "F": f})
        cases.append((key, prog, [inputs]))
        checks[key] = want[0]
    (got,) = spawn("tests._rows_workers:calls_or_errors", 1, args=(cases,), heap_bytes=1 << 24, timeout=600)

    first, err, again = got["gather"]
    assert torch.equal(first["Y"].float(), checks["gather"]) and torch.equal(again["Y"], first["Y"])
    assert err == ("rank 0: index out of range: idx[37] = 812 is not a row of dim 0 of 'X' (0..36) at"
                   " gather.tile:10:19; that row was not read or written"), err
    for sched in ("bsp", "flags"):
        x4, perm, twice = checks[f"scatter {sched}"]
        first, err, again = got[f"scatter {sched}"]
        want = torch.full((45, 24), float("nan"))
        want[perm.long()] = (x4.float() * 2).half().float()
        for out in (first, again):
            torch.testing.assert_close(out["Y"].float(), want, equal_nan=True, atol=0, rtol=0)
            torch.testing.assert_close(out["Z"].float(), (want + 1).half().float(), equal_nan=True, atol=0, rtol=0)
        assert err == (f"rank 0: rows not distinct: idx[33] = {int(perm[5])} names a row of dim 0 of 'Y' that another"
                       " element of this call's scatter at scatter.tile:11:7 also writes; only the first write of that"
                       " row was stored"), err
    ok, err = got["counted"]
    y = ok["Y"].float()
    for e, n in enumerate(cnt.tolist()):
        block = y[e * 40:(e + 1) * 40]
        torch.testing.assert_close(block[:n], x2.float()[e * 40:e * 40 + n] + 1, atol=2e-3, rtol=0)
        assert block[n:].isnan().all(), ("rows past the count were stored", e)
    assert "count out of range: cnt[1] = 41 is not a count of the 40 rows of loop 'c' (0..40)" in err, err
    assert torch.equal(got["produced"][0]["Y"].float(), checks["produced"])
    for key in ("moe_top1", "moe_top2", "moe_one", "moe_empty", "moe_ragged"):
        _close(got[key][0]["O"], checks[key], key)


def test_row_waits_wait_for_the_peer_tiles_the_rows_lie_in(monkeypatch):
    """A late rank (the adversary) computes the rows its peer gathers: the run-time waits (one counter per row, the
    producer tile it lies in) hold the reader back; with them removed it reads the previous call's rows."""
    right = _compile(PEER, world=2, schedule="flags")
    wait = re.compile(r"td\.wait_all\(F_Z_a, idx_rows // 8, idx_ok, .*?INTERPRET\)", re.S)
    assert wait.search(right.source), right.source
    wrong = _compile(PEER, world=2, schedule="flags")
    wrong.source = wait.sub("pass", wrong.source)
    g = torch.Generator().manual_seed(5)
    calls, want = [], []
    for _ in range(3):
        xs = [torch.randn(32, 16, generator=g).half() for _ in range(2)]
        idx = [torch.randint(8, 32, (16,), generator=g, dtype=torch.int32) for _ in range(2)]
        calls.append([{"X": xs[r], "idx": idx[r]} for r in range(2)])
        want.append([torch.cat([(xs[p].float() * 3).half().float()[idx[r].long()] for p in range(2)])
                     for r in range(2)])
    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.5")
    got = spawn("tests._rows_workers:calls_or_errors", 2, args=([("right", right, calls), ("wrong", wrong, calls)],),
                heap_bytes=1 << 22, timeout=600)
    worst = {k: max(float((got[r][k][i]["Y"].float() - want[i][r]).abs().max()) for i in range(3) for r in range(2))
             for k in ("right", "wrong")}
    assert worst["right"] == 0 and worst["wrong"] > 0.1, worst


def _moe_world(world: int, schedules: tuple[str, ...]):
    cases, want = [], {}
    for i, (k, route) in enumerate([(2, "any"), (1, "one")]):
        inputs, ref, _ = _moe_case(world, 24, 2, 16, k, route, seed=10 + i)
        for sched in schedules:
            prog = tilec.compile("examples/moe.tile", world=world, schedule=sched, dims={"T": 24, "K": k})
            cases.append(((sched, k, route), prog, [inputs]))
            want[(sched, k, route)] = ref
    got = spawn("tests._rows_workers:calls_or_errors", world, args=(cases,), heap_bytes=1 << 24, timeout=600)
    for rank, res in enumerate(got):
        for key, (out,) in res.items():
            _close(out["O"], want[key][rank], (rank, key))


def test_moe_at_world_2():
    _moe_world(2, ("flags",))


@pytest.mark.slow
@pytest.mark.parametrize("world, schedules", [(2, ("bsp", "specialized")), (3, ("bsp", "flags")), (4, ("flags",))])
def test_moe_at_worlds_2_to_4(world, schedules):
    _moe_world(world, schedules)


def test_a_scatter_split_into_column_tiles_claims_each_row_once_per_tile():
    """Found by tests/test_rows_generated.py: the tasks of a scatter that split its rows' other dim (`n in 24 by 8`)
    each wrote the row once, and the one claim word per row took the second for a repeated row ('rows not
    distinct' on a permutation). A row's word is now per element of the other dims; the reference interpreter keys
    its claims likewise."""
    split = SCATTER.replace("stage s over tok in T by BT:", "stage s over tok in T by BT, n in H by 8:").replace(
        "Y[idx[tok], :] = X[tok, :] * 2.0", "Y[idx[tok], n] = X[tok, n] * 2.0")
    prog = _compile(split, schedule="flags")
    assert "_claims_Y + idx_rows * 24 + n, epoch" in prog.source, prog.source
    x = torch.randn(40, 24).half()
    perm = torch.randperm(45)[:40].to(torch.int32)
    y = evaluate(check(parse(split, "scatter.tile"), 1), [{"X": x, "idx": perm}])[0]["Y"]
    assert torch.equal(y[perm.long()], (x.float() * 2).half())
