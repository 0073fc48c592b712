"""local-in-place: drop the copies of a tile to the rank that already holds it; readers read those rows in place.

A copy stage `B[w(p)] = S@r[s(p)]` (pull form) or `B@r[w(p)] = S[s(p)]` (pushed form, fuse-comm push) has, for
r == rank, tasks that copy a rank's own tiles into its own buffer. They move bytes through HBM for nothing: the
readers of B can read those elements from S where they are. Runs after replace-barriers (the flags exist).

  Before:  stage gather over r, m, k:  Ag@r[rank*M/W + m, k] = A[m, k]           release Ag.gather[m, rank]
           stage gemm over m, n:       wait Ag.gather;  C[m, n] = sum k: Ag[m, k] @ B[k, n]
  After:   stage gather over r != rank, m, k:  Ag@r[rank*M/W + m, k] = A[m, k]  (the peers only)
           stage gemm over m, n:       if the rows of Ag[m, :] are a peer's: wait Ag.gather
                                       C[m, n] = sum k: in_place(A[m, k] via Ag[m, k]) @ B[k, n]
  in_place reads, per element of the buffer tile, the copy's variables solved from its index (as fused-pull's pull
  does): where the copy's source rank is this rank, from S in place, else from B. The counters of the local rows
  are no longer released and no task waits on them (a reader tile lies in one rank's rows, so a task either reads
  in place and waits for nothing, or reads B and waits as before).

With one rank every copy is local: the copy stage, its flag and the buffer disappear and the readers pull from S
(as fused-pull would), unless whole=False (specialized: the copy stage is what it gives programs of their own).

It applies to a copy stage when: one store, S an input (read in place with no flag), B a buffer written only by
this stage and read only by plain local loads of stages after it, whose tile along the dim that solves the copy's
source rank stays within one rank's rows in every task (no reduction variable in that dim). Copy stages that do
not qualify are left as they are (`why_not` says why).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir.gather import counted_loop
from tilec.ir.graph import (
    FLAGS,
    InPlace,
    Pull,
    Stage,
    flags,
    node_order,
    payload_of,
    program_of,
    rebuild_edges,
    set_payload,
    sid,
    stages,
    sync,
    tid,
    update_state,
)
from tilec.ir.queries import copy_stages
from tilec.ir.tiling import DimInverse, invert
from tilec.ir.types import ME, Access, Affine, Load, Store, Var, map_expr, reduction_vars, walk

from .base import Pass


@dataclass(frozen=True)
class LocalInPlace(Pass):
    whole: bool = True  # with one rank, remove the whole copy (specialized keeps it: its programs are split by it)
    name = "local-in-place"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        if sync(g) != FLAGS:
            return g  # barrier schedules copy in their own kernel: nothing overlaps, nothing to gain
        prog = program_of(g)
        for name in [s.name for s in copy_stages(g, single=True)]:
            cp = payload_of(g, sid(name)) if sid(name) in g else None  # as an earlier rewrite left it
            if cp is None or cp.skip_equal or not isinstance(cp.body[0].value, Load):
                continue  # (a dma stage qualifies too: the copy engines then copy only the peers' tiles)
            if why_not(g, cp, prog.world):
                continue
            if prog.world == 1:
                if self.whole:
                    _fuse_all(g, cp)
            else:
                _skip_local(g, cp)
        rebuild_edges(g)
        return g


def rank_pair(st: Store, loops: dict[str, Var]) -> tuple[str, str] | None:
    """(source rank var, destination rank var) of a copy's store when one is `rank` and the other a rank loop."""
    s, d = st.value.access.rank, st.access.rank
    if {s, d} & {ME} and s != d and all(v == ME or (v in loops and loops[v].is_rank) for v in (s, d)):
        return s, d
    return None


def solving_dim(write: Access, src_rank: str, loops: dict[str, Var], world: int) -> DimInverse | None:
    """The dim of the copy's write whose index solves the copy's source rank."""
    try:
        dims = invert(write, loops | {ME: Var(ME, "me", world, 1, write.loc)}, set(), world, "local-in-place")
    except ScheduleError:
        return None
    return next((d for d in dims if d.rank_var == src_rank), None)


def within_block(read: Access, d: DimInverse, scope: dict[str, Var]) -> bool:
    """Every task's tile of `read` along dim d.dim lies in one rank's block of the copy's write (statically:
    starts and extents are multiples of the tile, and a rank's block holds whole tiles)."""
    aff, tv = read.index[d.dim], read.tile[d.dim]
    span = read.shape[d.dim]
    if tv is None:
        return span == 1
    starts_ok = all((k * scope[v].step) % span == 0 for v, k in aff.terms)
    return starts_ok and (aff.const - d.const) % span == 0 and d.rank_coef % span == 0 and scope[tv].step == span


def why_not(g: nx.DiGraph, cp: Stage, world: int) -> str | None:
    st = cp.body[0]
    loops = {v.name: v for v in cp.loops}
    pair = rank_pair(st, loops)
    if pair is None:
        return "it does not copy between `rank` and a rank loop"
    src = payload_of(g, tid(st.value.access.tensor))
    buf = payload_of(g, tid(st.access.tensor))
    if src.kind != "in":
        return f"its source '{src.name}' is computed, and an in-place read would need its flag"
    if buf.kind != "buf":
        return f"'{buf.name}' is not a buffer"
    if buf.dtype != src.dtype:  # one pointer reads either: the copy must not convert
        return f"the copy converts {src.dtype} to {buf.dtype}"
    if counted_loop(cp.loops) is not None:  # an in-place read would see the rows past the count too
        return "it copies only the rows under a data-dependent count"
    d = solving_dim(st.access, pair[0], loops, world)
    if d is None or d.rank_coef == 0:
        return f"the index of '{buf.name}' does not solve the copy's source rank"
    if not all(v.name in st.access.vars for v in cp.loops if v.trips > 1):
        return "some task of it writes the same tile as another"
    for f in flags(g):
        if f.producer == cp.name and pair[0] not in f.key:  # e.g. granularity=tensor: one counter for every rank
            return f"flag {f.name} counts the local copies together with the peers' copies"
    order = [s.name for s in stages(g)]
    for s in stages(g):
        if s.name == cp.name:
            continue
        if any(x.access.tensor == buf.name for x in s.body):
            return f"stage '{s.name}' writes '{buf.name}' too"
        red = {v.name for x in s.body for v in reduction_vars(x.value)}
        scope = {v.name: v for v in s.loops} | {v.name: v for x in s.body for v in reduction_vars(x.value)}
        for x in s.body:
            for e in walk(x.value):
                if isinstance(e, Pull) and e.read.tensor == buf.name:
                    return f"stage '{s.name}' already pulls '{buf.name}'"
                if not isinstance(e, Load) or e.access.tensor != buf.name:
                    continue
                a = e.access
                if a.remote:
                    return f"stage '{s.name}' reads '{buf.name}' on a peer"
                if order.index(s.name) < order.index(cp.name):
                    return f"stage '{s.name}' reads '{buf.name}' before the copy"
                if set(a.index[d.dim].vars) & red:
                    return f"stage '{s.name}' reads '{buf.name}' across ranks' rows inside a reduction"
                if not within_block(a, d, scope):
                    return f"a tile of '{buf.name}' that stage '{s.name}' reads straddles two ranks' rows"
    return None


def _readers_rewritten(g: nx.DiGraph, cp: Stage, make) -> None:
    st = cp.body[0]
    buf = st.access.tensor

    def fn(e):
        if isinstance(e, Load) and e.access.tensor == buf:
            return make(e)
        return e

    for c in stages(g):
        if c.name == cp.name:
            continue
        body = tuple(replace(x, value=map_expr(x.value, fn)) for x in c.body)
        if body != c.body:
            note = f"reads {buf} rows of this rank in place from {st.value.access.tensor}"
            set_payload(g, sid(c.name), replace(c, body=body, note=_join(c.note, note)))


def _skip_local(g: nx.DiGraph, cp: Stage) -> None:
    st = cp.body[0]
    pair = rank_pair(st, {v.name: v for v in cp.loops})
    dtype = payload_of(g, tid(st.value.access.tensor)).dtype
    _readers_rewritten(g, cp, lambda e: InPlace(e.access, st.access, st.value.access, cp.loops, dtype, e.shape,
                                                e.loc))
    set_payload(g, sid(cp.name), replace(cp, skip_equal=(pair,),
                                               note=_join(cp.note, "copies only between peers (local rows in place)")))


def _fuse_all(g: nx.DiGraph, cp: Stage) -> None:
    """One rank: every copy is local. The readers pull from the source; the stage, its flags and the buffer go."""
    st = cp.body[0]
    s, d = rank_pair(st, {v.name: v for v in cp.loops})
    loop = s if d == ME else d  # the rank loop is the rank itself
    write = _rank_to_me(st.access, loop)
    source = _rank_to_me(st.value.access, loop)
    dtype = payload_of(g, tid(source.tensor)).dtype
    _readers_rewritten(g, cp, lambda e: Pull(e.access, write, source, cp.loops, dtype, e.shape, e.loc))
    for f in flags(g):
        if f.producer == cp.name:
            g.remove_node(f"f:{f.name}")
    g.remove_node(sid(cp.name))
    g.remove_node(tid(st.access.tensor))
    update_state(g, order=tuple(n for n in node_order(g) if n != sid(cp.name)))


def _rank_to_me(a: Access, var: str) -> Access:
    """`var` (the copy's rank loop) is the rank itself, and with one rank `rank` is 0: the index loses both."""
    zero = Affine((), 0)
    return replace(a, rank=ME if a.rank == var else a.rank,
                   index=tuple(i.subst(var, zero).subst(ME, zero) for i in a.index))


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
