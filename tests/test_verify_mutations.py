"""The verifier against every single mutation of every example's final graph, against programs with the bugs a
verifier must catch (reads nobody writes, cross-rank write conflicts), against brute force on generated copy
programs, and without false rejections on every example and test program under every schedule that applies.

A mutant is one systematic change that makes the graph wrong (or inconsistent with what codegen emits from it):
drop a release or a wait, retarget a wait (flag, index, rank, tile), change a flag's count, size, key or store,
drop a flag, reorder or regroup kernels, drop a barrier, un-persist a kernel that waits, change a store's or a
read's index or rank, shrink a loop, break a pull. Each must be rejected with a VerifyError whose every problem is
located (`file:line:col:` or `file:`), never accepted and never any other exception.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from pathlib import Path

import pytest

from tilec.errors import CompileError, ScheduleError, VerifyError
from tilec.frontend.parser import parse
from tilec.frontend.sema import check
from tilec.ir.graph import Pull, copy_graph, flags, sid, stages, state_of, update_state
from tilec.ir.types import ME, Affine, Load, Var, map_expr
from tilec.passes.base import run_pipeline
from tilec.passes.lower import Lower
from tilec.passes.schedules import SCHEDULES, pipeline
from tilec.passes.verify import verify

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.tile"))
PROGRAMS = sorted((ROOT / "tests" / "programs").glob("*.tile"))
LOCATED = re.compile(r"^[\w./-]+\.tile(:\d+:\d+)?: ")


def final_graph(path: Path | str, world: int, schedule: str, dims: dict | None = None, source: str | None = None,
                granularity: str = "auto"):
    """The verified graph after every pass of the schedule (what tilec.compile hands to codegen), or None when
    the schedule does not apply. Every pass is verified on the way, as tilec.compile does."""
    name = str(path.relative_to(ROOT)) if isinstance(path, Path) else path
    text = source if source is not None else Path(path).read_text()
    g = Lower()(check(parse(text, name), world, dims))
    verify(g, "lower")
    try:
        return run_pipeline(g, pipeline(schedule, granularity), verify)
    except ScheduleError:
        return None


def rejected(g) -> str:
    """The verifier's problems on a graph it must reject."""
    try:
        verify(g, "mutant")
    except VerifyError as e:
        bad = [p for p in e.problems if not LOCATED.match(p)]
        assert not bad, f"problems without a location: {bad}"
        return "; ".join(e.problems)
    raise AssertionError("accepted")


# ---- the mutations ---------------------------------------------------------------------------------------


def _shift(a, d: int, by: int):
    idx = list(a.index)
    idx[d] = Affine(idx[d].terms, idx[d].const + by)
    return dataclasses.replace(a, index=tuple(idx))


def _set_stage(g, s, **kw):
    g.nodes[sid(s.name)]["payload"] = dataclasses.replace(s, **kw)


def _set_flag(g, f, **kw):
    g.nodes[f"f:{f.name}"]["payload"] = dataclasses.replace(f, **kw)


def _rank_swaps(s, a):
    """Other ranks an access of stage s could name: `rank` <-> each rank loop var."""
    ranks = [v.name for v in s.loops if v.is_rank]
    return [r for r in ([ME] + ranks) if r != a.rank]


def _replace_load(s, old, new):
    def fn(e):
        return dataclasses.replace(e, access=new) if isinstance(e, Load) and e.access == old else e
    return tuple(dataclasses.replace(st, value=map_expr(st.value, fn)) for st in s.body)


def _replace_pull(s, old, new):
    def fn(e):
        return new if isinstance(e, Pull) and e == old else e
    return tuple(dataclasses.replace(st, value=map_expr(st.value, fn)) for st in s.body)


def _pulls(s):
    from tilec.passes.verify import reads_of

    return [r.expr for r in reads_of(s) if isinstance(r.expr, Pull)]


def _loads(s):
    from tilec.passes.verify import reads_of

    return list(dict.fromkeys(r.expr for r in reads_of(s) if isinstance(r.expr, Load)))


def _waits_of(g, s):
    return [w for _, _, d in g.in_edges(sid(s.name), data=True) if d["kind"] == "wait" for w in d["waits"]]


def mutants(g0):
    """(name, mutated copy) for every single mutation of the family."""
    prog = state_of(g0).program
    tens = {d["payload"].name: d["payload"] for _, d in g0.nodes(data=True) if d["kind"] == "tensor"}

    def fresh():
        return copy_graph(g0)

    # -- releases and flags
    for f in flags(g0):
        g = fresh()
        g.remove_edge(sid(f.producer), f"f:{f.name}")
        yield f"drop release {f.name}", g
        g = fresh()
        g.remove_node(f"f:{f.name}")
        yield f"drop flag {f.name}", g
        for by in (-1, 1):
            g = fresh()
            _set_flag(g, f, count=f.count + by)
            yield f"count {f.name} {by:+}", g
            g = fresh()
            _set_flag(g, f, size=f.size + by)
            yield f"size {f.name} {by:+}", g
        for d in range(len(f.write.index)):
            g = fresh()
            _set_flag(g, f, write=_shift(f.write, d, 1))
            yield f"flag {f.name} store dim {d} +1", g
        loops = {v.name: v for v in g0.nodes[sid(f.producer)]["payload"].loops}
        for v in f.key:
            if v in loops and loops[v].trips == 1:
                continue  # a one-trip var tells no counters apart: dropping it from the key changes nothing
            g = fresh()
            _set_flag(g, f, key=tuple(k for k in f.key if k != v))
            yield f"flag {f.name} key without {v}", g
        for other in stages(g0):
            if other.name != f.producer:
                g = fresh()
                _set_flag(g, f, producer=other.name)
                g.remove_edge(sid(f.producer), f"f:{f.name}")
                g.add_edge(sid(other.name), f"f:{f.name}", kind="release")
                yield f"flag {f.name} released by {other.name}", g
    # -- waits
    for u, v, d in g0.edges(data=True):
        if d["kind"] != "wait":
            continue
        for i, w in enumerate(d["waits"]):
            rest = d["waits"][:i] + d["waits"][i + 1:]

            def with_wait(new, u=u, v=v, rest=rest):
                g = fresh()
                g.edges[u, v]["waits"] = (*rest, new)
                return g

            g = fresh()
            if rest:
                g.edges[u, v]["waits"] = rest
            else:
                g.remove_edge(u, v)
            yield f"drop wait {w.flag} in {v}", g
            for f in flags(g0):
                if f.name != w.flag:
                    g = fresh()
                    g.edges[u, v]["waits"] = rest
                    if not rest:
                        g.remove_edge(u, v)
                    nw = dataclasses.replace(w, flag=f.name)
                    if g.has_edge(f"f:{f.name}", v):
                        g.edges[f"f:{f.name}", v]["waits"] += (nw,)
                    else:
                        g.add_edge(f"f:{f.name}", v, kind="wait", waits=(nw,))
                    yield f"wait {w.flag} in {v} on {f.name}", g
            s = g0.nodes[v]["payload"]
            for dim in range(len(w.read.index)):
                for by in (-1, 1, w.read.shape[dim]):
                    yield f"wait {w.flag} in {v} dim {dim} {by:+}", with_wait(
                        dataclasses.replace(w, read=_shift(w.read, dim, by)))
                if w.read.tile[dim]:
                    tiles = list(w.read.tile)
                    shape = list(w.read.shape)
                    tiles[dim], shape[dim] = None, 1
                    yield f"wait {w.flag} in {v} dim {dim} narrowed", with_wait(dataclasses.replace(
                        w, read=dataclasses.replace(w.read, tile=tuple(tiles), shape=tuple(shape))))
            for r in _rank_swaps(s, w.read):
                yield f"wait {w.flag} in {v} on rank {r}", with_wait(
                    dataclasses.replace(w, read=dataclasses.replace(w.read, rank=r)))
            for other in stages(g0):  # the wait names another releasing stage, or another tensor
                if other.name != w.producer:
                    yield f"wait {w.flag} in {v} released by {other.name}", with_wait(
                        dataclasses.replace(w, producer=other.name))
            for t in tens:
                if t != w.tensor:
                    yield f"wait {w.flag} in {v} of tensor {t}", with_wait(dataclasses.replace(w, tensor=t))
    g = fresh()
    update_state(g, sync="never")
    yield "unknown sync", g
    # -- kernels
    ks = (state_of(g0).kernels or ())
    for i in range(len(ks) - 1):
        g = fresh()
        new = list(ks)
        new[i], new[i + 1] = new[i + 1], new[i]
        update_state(g, kernels=tuple(new))
        yield f"swap kernels {i} {i + 1}", g
    for i, k in enumerate(ks):
        if len(k.stages) > 1:
            g = fresh()
            new = list(ks)
            new[i] = dataclasses.replace(k, stages=tuple(reversed(k.stages)))
            update_state(g, kernels=tuple(new))
            yield f"reverse stages of {k.name}", g
        for j in (i - 1, i + 1):
            if 0 <= j < len(ks):
                for s in (k.stages[0], k.stages[-1]):
                    g = fresh()
                    new = list(ks)
                    new[i] = dataclasses.replace(k, stages=tuple(x for x in k.stages if x != s))
                    new[j] = dataclasses.replace(ks[j], stages=(*ks[j].stages, s) if j < i else (s, *ks[j].stages))
                    update_state(g, kernels=tuple(new))
                    yield f"move {s} to kernel {j}", g
        if k.barrier_before:
            g = fresh()
            new = list(ks)
            new[i] = dataclasses.replace(k, barrier_before=False)
            update_state(g, kernels=tuple(new))
            yield f"drop barrier before {k.name}", g
        waiting = {x for s in k.stages for x in [s]
                   if any(d["kind"] == "wait" for _, _, d in g0.in_edges(sid(s), data=True))}
        producing = {f.producer for f in flags(g0)} & set(k.stages)
        if k.persistent and (waiting or (producing and k.concurrent)):
            g = fresh()
            new = list(ks)
            new[i] = dataclasses.replace(k, persistent=False)
            update_state(g, kernels=tuple(new))
            yield f"{k.name} not persistent", g
        if k.groups:
            g = fresh()
            new = list(ks)
            new[i] = dataclasses.replace(k, groups=k.groups[:-1])
            update_state(g, kernels=tuple(new))
            yield f"{k.name} loses a program group", g
    for n in state_of(g0).order:
        if g0.nodes[n]["kind"] == "barrier":
            g = fresh()
            g.remove_node(n)
            update_state(g, order=tuple(x for x in state_of(g).order if x != n))
            yield f"drop {n} from the order only", g
    order = list(state_of(g0).order)
    for i in range(len(order) - 1):
        if g0.nodes[order[i]]["kind"] == g0.nodes[order[i + 1]]["kind"] == "stage":
            g = fresh()
            o = list(order)
            o[i], o[i + 1] = o[i + 1], o[i]
            update_state(g, order=tuple(o))
            yield f"swap {order[i]} {order[i + 1]} in the order", g
    # -- stages: stores, reads, pulls, loops
    for s in stages(g0):
        for j, st in enumerate(s.body):
            def with_store(a, s=s, j=j, st=st):
                g = fresh()
                body = list(s.body)
                body[j] = dataclasses.replace(st, access=a)
                _set_stage(g, s, body=tuple(body))
                return g

            for dim in range(len(st.access.index)):
                for by in (-1, 1):
                    yield f"store {st.access} dim {dim} {by:+}", with_store(_shift(st.access, dim, by))
            for r in _rank_swaps(s, st.access):
                if tens[st.access.tensor].symmetric or r == ME:
                    yield f"store {st.access} on {r}", with_store(dataclasses.replace(st.access, rank=r))
        for ld in _loads(s):
            a = ld.access
            if tens.get(a.tensor) is None or tens[a.tensor].kind == "in":
                continue
            for dim in range(len(a.index)):
                for by in (-1, 1):
                    g = fresh()
                    _set_stage(g, s, body=_replace_load(s, a, _shift(a, dim, by)))
                    yield f"read {a} in {s.name} dim {dim} {by:+}", g
            # reading another rank's copy is only wrong here when a wait names the read (its tile is then read
            # unwaited); without flags it may just be another correct program, which no verifier can tell
            waited = any(w.read == a for w in _waits_of(g0, s))
            for r in _rank_swaps(s, a):
                if tens[a.tensor].symmetric and waited:
                    g = fresh()
                    _set_stage(g, s, body=_replace_load(s, a, dataclasses.replace(a, rank=r)))
                    yield f"read {a} in {s.name} on {r}", g
        for p in _pulls(s):
            for part in ("read", "write", "source"):
                a = getattr(p, part)
                for dim in range(len(a.index)):
                    for by in (-1, 1):
                        g = fresh()
                        _set_stage(g, s, body=_replace_pull(s, p, dataclasses.replace(p, **{part: _shift(a, dim, by)})))
                        yield f"pull {part} {a} dim {dim} {by:+}", g
            for v in p.producer:
                if v.trips > 1:
                    g = fresh()
                    loops = tuple(x for x in p.producer if x != v)
                    _set_stage(g, s, body=_replace_pull(s, p, dataclasses.replace(p, producer=loops)))
                    yield f"pull without copy loop {v.name}", g
        stored = {x for st in s.body for x in st.access.vars}
        for li, v in enumerate(s.loops):
            if v.extent <= 1 or v.name not in stored:
                continue  # a loop only reads see reads less: another program, not a broken one
            smaller = v.extent - (v.step if v.extent > v.step else 1)
            loops = list(s.loops)
            loops[li] = Var(v.name, v.kind, smaller, v.step, v.loc)
            g = fresh()
            _set_stage(g, s, loops=tuple(loops))
            yield f"shrink {s.name}.{v.name} to {smaller}", g
    del prog


# ---- the tests -------------------------------------------------------------------------------------------

CASES = [(p, 2, s, None) for p in EXAMPLES for s in SCHEDULES] + \
    [(ROOT / "examples" / "ag_gemm.tile", 3, s, {"M": 96, "N": 64, "K": 64, "BM": 32}) for s in SCHEDULES] + \
    [(ROOT / "examples" / "flash_decode.tile", 3, s, {"B": 1, "HKV": 1, "G": 2, "S": 64})
     for s in ("bsp", "fused-push")]


@pytest.mark.parametrize("path, world, schedule, dims", CASES,
                         ids=[f"{p.stem}-w{w}-{s}" for p, w, s, _ in CASES])
def test_every_single_mutation_is_rejected(path, world, schedule, dims):
    g0 = final_graph(path, world, schedule, dims)
    if g0 is None:
        pytest.skip(f"{schedule} does not apply to {path.name}")
    verify(copy_graph(g0), "original")  # the unmutated graph is fine
    accepted, crashed, n = [], [], 0
    for name, g in mutants(g0):
        n += 1
        try:
            rejected(g)
        except AssertionError as e:
            accepted.append(f"{name}: {e}")
        except Exception as e:  # noqa: BLE001 - any other exception is a verifier crash: collect them all
            crashed.append(f"{name}: {type(e).__name__}: {e}")
    assert n >= 10, n
    assert not crashed, f"{len(crashed)} of {n} mutants crashed the verifier: {crashed[:5]}"
    assert not accepted, f"{len(accepted)} of {n} mutants were accepted: {accepted[:8]}"


def test_mutations_are_rejected_for_the_reason_they_break():
    """A few mutants with the rule that must name them (the families above only require some rejection)."""
    g0 = final_graph(ROOT / "examples" / "ag_gemm.tile", 2, "flags")
    m = dict(mutants(g0))
    assert "missing release: stage 'gather' does not release flag Ag.gather" in rejected(m["drop release Ag.gather"])
    assert "examples/ag_gemm.tile:17:33: error:" \
        " read before flag: stage 'gemm' reads Ag[m, k] (written by stage 'gather')" \
        in rejected(m["drop wait Ag.gather in s:gemm"])
    assert "examples/ag_gemm.tile:17:33: error:" \
        " stage 'gemm' (kernel k1_gemm) waits on stage 'gather' of kernel k0_gather," \
        " which is launched after it" in rejected(m["swap kernels 0 1"])
    assert "kernels run the stages in the order gemm, gather, not in program order" in rejected(m["swap kernels 0 1"])
    # the copy skips its local tasks (local-in-place), so at world 2 one task per element is left: the in-place read
    # no longer matches the copy, whose peers' rows nobody stores now
    assert "examples/ag_gemm.tile:17:33: error:" \
        " stage 'gemm' reads Ag[m, k] in place from A@r[m, k]: stage 'gather' is not" \
        " the copy" in rejected(m["store Ag[m + 128*r, k] on r"])
    assert "examples/ag_gemm.tile:10:3: error: output 'C' is not written everywhere the program writes it: no stage" \
        " stores C[0, 128] on rank 0" in rejected(m["shrink gemm.n to 128"])
    bsp = dict(mutants(final_graph(ROOT / "examples" / "gemm_rs.tile", 2, "bsp")))
    text = rejected(bsp["drop b:0 from the order only"])
    assert "kernel k1_reduce waits at a global barrier before it, but the program has no barrier" in text


def _without_barriers(g):
    for n in [n for n in state_of(g).order if g.nodes[n]["kind"] == "barrier"]:
        g.remove_node(n)
    update_state(g, order=tuple(n for n in state_of(g).order if n in g))
    update_state(g, kernels=tuple(dataclasses.replace(k, barrier_before=False) for k in state_of(g).kernels))
    return g


@pytest.mark.parametrize("example, ok", [("ag_gemm", True), ("gemm_rs", False), ("gemm_ar", False),
                                         ("flash_decode", False)])
def test_dropping_every_barrier_consistently_is_decided_by_where_data_lives(example, ok):
    """bsp without its barriers: only a program whose stages read nothing that another rank wrote stays correct
    (ag_gemm's gather pulls into its own rank's buffer; the others push partials or read peers' results)."""
    g = _without_barriers(copy_graph(final_graph(ROOT / "examples" / f"{example}.tile", 2, "bsp")))
    if ok:
        verify(g, "no barriers")
    else:
        assert "without a barrier or a wait on its flag" in rejected(g)


# ---- programs with unwritten reads and cross-rank write conflicts -------------------------------------------

HEAD = """program p(world W)
  dims M = 32, N = 16
  tiles BM = 8, BN = 16
  in  X : f32[M, N] symmetric
"""


@pytest.mark.parametrize("body, message", [
    # a peer's rows that no stage writes (bsp returned whatever memory held; flags waited forever)
    ("""  buf Y : f32[M, N] symmetric
  out Z : f32[M*W, N]
  stage a over m in M/2 by BM, n in N by BN:
    Y[m, n] = X[m, n]
  barrier
  stage b over r in ranks, m in M by BM, n in N by BN:
    Z[r*M + m, n] = Y@r[m, n]
""", "p.tile:11:21: error: stage 'b' reads Y@r[m, n], but no earlier stage writes Y[16, 0] on rank 0"),
    # rows beyond what any stage writes: every rank fills its own block only, then reads its peer's other block
    ("""  buf Y : f32[M*W, N] symmetric
  out Z : f32[M, N]
  stage a over m in M by BM, n in N by BN:
    Y[rank*M + m, n] = X[m, n]
  barrier
  stage b over m in M by BM, n in N by BN:
    Z[m, n] = Y@rank[(W - 1 - rank)*M + m, n] + X@rank[m, n]
""", "but no earlier stage writes Y["),
    # every rank pushes into the same rows of every peer
    ("""  buf Y : f32[M, N] symmetric
  out Z : f32[M, N]
  stage a over r in ranks, m in M by BM, n in N by BN:
    Y@r[m, n] = X[m, n]
  barrier
  stage b over m in M by BM, n in N by BN:
    Z[m, n] = Y[m, n]
""", "p.tile:8:5: error: write conflict: tasks of stage 'a' store Y@r[m, n] into the same element Y[0, 0] on rank 0"),
    # a later stage overwrites what a peer still reads in the same phase
    ("""  buf Y : f32[M, N] symmetric
  out Z : f32[M, N]
  stage a over m in M by BM, n in N by BN:
    Y[m, n] = X[m, n]
  barrier
  stage b over r in ranks, m in M/W by BM, n in N by BN:
    Z[r*M/W + m, n] = Y@r[r*M/W + m, n]
  stage c over m in M by BM, n in N by BN:
    Y[m, n] = X[m, n] * 2
""", "race: stage 'c' stores Y[m, n] over elements that stage 'b' reads"),
], ids=["peer-unwritten", "rows-beyond", "push-conflict", "overwrite-race"])
@pytest.mark.parametrize("world", [2, 3])
def test_programs_with_unwritten_reads_or_write_conflicts_are_rejected(body, message, world):
    src = HEAD + body
    if world == 3 and "M/W" in body:
        src = src.replace("M = 32", "M = 48")
    with pytest.raises(VerifyError) as info:
        final_graph("p.tile", world, "bsp", source=src)
    assert info.value.pass_name == "lower"
    assert message in str(info.value)
    assert all(LOCATED.match(p) for p in info.value.problems)


# ---- brute force on generated copy programs ------------------------------------------------------------------

GEN = """program gen(world W)
  dims M = {M}
  tiles BM = {BM}
  in  X : f32[{SX}, 8] symmetric
  buf Y : f32[{SY}, 8] symmetric
  out Z : f32[{SZ}, 8]
  stage a over {LA}m in {EA} by BM, n in 8 by 8:
    Y{DA}[{IA}, n] = X[m, n]
  barrier
  stage b over {LB}m in {EB} by BM, n in 8 by 8:
    Z[{IZ}, n] = Y{DB}[{IB}, n]
"""


def _gen_case(rnd: random.Random, world: int):
    """One random pair of copy stages; each term is likely where it makes the program correct, so both correct
    and buggy programs come up often."""
    M, BM = rnd.choice([(16, 8), (24, 8), (32, 16)])
    ranks_a, ranks_b = rnd.random() < 0.6, rnd.random() < 0.6
    ea = rnd.choice(["M", "M", "M", "M/2", "M - BM"]) if M % 2 == 0 else "M"
    eb = rnd.choice(["M", "M", "M", "M/2", "M + BM"])
    da = rnd.choice(["", "@r"] if ranks_a else [""])
    db = rnd.choice(["", "@q", "@rank"] if ranks_b else ["", "@rank"])

    def terms(likely: list[str], rare: list[str]) -> str:
        return " + ".join(["m"] + [t for t in likely if rnd.random() < 0.8] + [t for t in rare if rnd.random() < 0.2])

    # tasks of different exec ranks (and rank loop values) must land on different rows or ranks
    ia = terms(["rank*M"] if da == "@r" else (["r*M"] if ranks_a else []),
               [t for t in ("rank*M", "r*M", "M") if t != "r*M" or ranks_a])
    ib = terms(["q*M"] if ranks_b and db == "@q" and ranks_a else [], [t for t in ("rank*M", "q*M", "M")
                                                                      if t != "q*M" or ranks_b])
    iz = terms(["q*M"] if ranks_b else [], ["rank*M"])
    c = dict(M=M, BM=BM, ranks_a=ranks_a, ranks_b=ranks_b, ea=ea, eb=eb, ia=ia, ib=ib, iz=iz, da=da, db=db)
    c["SZ"] = 1 + max(x for _, x in _touched(c, world)[1])  # Z just holds the rows stage b stores
    src = GEN.format(M=M, BM=BM, SX="2*M", SY="M*W + M", SZ=c["SZ"], LA="r in ranks, " if ranks_a else "",
                     EA=ea, DA=da, IA=ia, LB="q in ranks, " if ranks_b else "", EB=eb, IZ=iz, DB=db, IB=ib)
    return src, c


def _ev(expr: str, env: dict, M: int, W: int) -> int:
    return int(eval(expr, {}, dict(env, M=M, W=W)))  # noqa: S307 - our own generated index text


def _touched(c: dict, world: int):
    """Brute force: the tasks (exec rank, loop values) behind every (rank holding, row) that stage a stores, that
    stage b stores into Z, and that stage b reads of Y, one task at a time."""
    M, BM, W = c["M"], c["BM"], world
    ext = {"M": M, "M/2": M // 2, "M - BM": M - BM, "M + BM": M + BM}
    la = ([("r", W, 1)] if c["ranks_a"] else []) + [("m", ext[c["ea"]], BM)]
    lb = ([("q", W, 1)] if c["ranks_b"] else []) + [("m", ext[c["eb"]], BM)]

    def stage_elems(loops, dest, idx, extent):
        out: dict[tuple[int, int], list] = {}
        for me in range(W):
            for vals in itertools.product(*[range(0, e, s) for _, e, s in loops]):
                env = dict(zip([n for n, _, _ in loops], vals, strict=True)) | {"rank": me}
                owner = me if dest in ("", "@rank") else env[dest[1:]]
                start = _ev(idx, env, M, W)
                for x in range(start, start + min(BM, extent - env["m"])):
                    out.setdefault((owner, x), []).append((me, vals))
        return out

    return (stage_elems(la, c["da"], c["ia"], ext[c["ea"]]), stage_elems(lb, "", c["iz"], ext[c["eb"]]),
            stage_elems(lb, c["db"], c["ib"], ext[c["eb"]]))


def _oracle(c: dict, world: int) -> str | None:
    """Which bug (if any) the generated program has."""
    wa, wz, rb = _touched(c, world)
    if any(len(v) > 1 for v in wa.values()) or any(len(v) > 1 for v in wz.values()):
        return "write conflict"
    if any(k not in wa for k in rb):
        return "no earlier stage writes"
    return None  # an output written in part is the program's choice (the rest keeps what the caller put there)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_generated_copy_programs_match_brute_force(world):
    """Random copy programs (local and peer reads and pushes, rank-dependent rows, short and long loops) that the
    front end accepts: the verifier rejects exactly those whose tasks, enumerated one by one, conflict, read
    rows nobody wrote, or leave output rows unwritten, and names that bug."""
    rnd = random.Random(1600 + world)
    seen = {"ok": 0, "bug": 0}
    for _ in range(150):
        src, c = _gen_case(rnd, world)
        try:
            g = Lower()(check(parse(src, "gen.tile"), world))
        except CompileError:
            continue  # out of bounds, a conflict within one rank, ...: the front end's business
        want = _oracle(c, world)
        try:
            verify(g, "lower")
            got = None
        except VerifyError as e:
            got = str(e)
        if want is None:
            assert got is None, f"false rejection of\n{src}\n{got}"
            seen["ok"] += 1
        else:
            assert got is not None and want in got, f"missed '{want}' in\n{src}\ngot: {got}"
            seen["bug"] += 1
    assert seen["ok"] >= 5 and seen["bug"] >= 5, seen


# ---- no false rejections ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES + PROGRAMS, ids=[p.stem for p in EXAMPLES + PROGRAMS])
def test_every_program_verifies_under_every_schedule_that_applies(path):
    applied = 0
    for world, schedule in itertools.product((1, 2, 4), SCHEDULES):
        for granularity in ("auto", "tile", "rank", "tensor"):
            try:
                g = final_graph(path, world, schedule, granularity=granularity)
            except CompileError:
                break  # dims that do not divide by this world
            applied += g is not None
    assert applied >= 5, applied
