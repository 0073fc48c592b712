"""Rule reads: every element a stage reads of a computed tensor, on the rank that holds it, is written by an
earlier stage and ordered before the read (by a barrier, by program order on that rank, or, under flags, by a
wait that rule waits checks), no later store races the read, a fused pull's copy writes every element it reads
once, an in-place read's tiles each lie in one rank's rows, and the dataflow has no cycle.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from tilec.ir import peers, regions
from tilec.ir.graph import InPlace, Pull, Stage
from tilec.ir.types import ME, Load, Var

from .context import Ctx, Read, decide, reads_of, same_rank, seq_before, solving_dim, stores_of


def check(ctx: Ctx) -> None:
    by_tensor = stores_of(ctx)
    dep = nx.DiGraph()
    dep.add_nodes_from(ctx.pos)
    for c in ctx.stages:
        sc = ctx.scope(c)
        for rd in reads_of(c):
            e = rd.expr
            if isinstance(e, InPlace):
                _in_place(ctx, c, rd, sc, by_tensor, dep)
                continue
            if isinstance(e, Pull):
                _pull_cover(ctx, c, e, sc)
                continue
            a = e.access
            if ctx.tensor(a.tensor).kind == "in":
                continue
            r = ctx.region(a, sc, f"r:{c.name}")
            ws = by_tensor.get(a.tensor, [])
            if len(ws) > 1:  # several writers (the steps of a ring): the ones whose elements this read reaches
                ws = [w for w in ws if _meets(ctx, e.loc, c, a, r, w[2])]
            for s, _, _ in ws:
                if s.name != c.name:
                    dep.add_edge(s.name, c.name)
            if any(s.name == c.name for s, _, _ in ws):
                ctx.err(e.loc, f"stage '{c.name}' reads '{a.tensor}', which it writes itself")
                continue
            prior = [w for w in ws if ctx.pos[w[0].name] < ctx.pos[c.name]]
            later = [w for w in ws if ctx.pos[w[0].name] > ctx.pos[c.name]]
            if not prior:
                who = f"before stage '{later[0][0].name}' writes it" if later else "which no stage writes"
                ctx.err(e.loc, f"stage '{c.name}' reads '{a.tensor}' {who}")
                continue
            hole = decide(ctx, e.loc, f"stage '{c.name}' reads {a}", regions.uncovered, [w[2] for w in prior], r)
            if hole:
                ctx.err(e.loc, f"stage '{c.name}' reads {a}, but no earlier stage writes {ctx.element(a.tensor, hole)}")
                continue
            if ctx.flagged and len(prior) > 1:
                ctx.err(e.loc, f"cannot prove that stage '{c.name}' waits for every writer of what it reads of {a}:"
                               f" it reaches elements of stages '{prior[0][0].name}' and '{prior[1][0].name}' (per-tile"
                               " flags order one producer); rewrite the read as one per writer")
                continue
            if ctx.flagged:
                ctx.flag_reads.append((c, rd, prior[0][0].name))
                continue
            for s, st, rw in prior:
                ordered = ctx.phase[s.name] < ctx.phase[c.name] or (
                    same_rank(ctx, a, st.access) and seq_before(ctx, s.name, c.name))
                if not ordered and decide(ctx, e.loc, f"stage '{c.name}' reads {a}", regions.common, r, rw):
                    ctx.err(e.loc, f"read before flag: stage '{c.name}' reads {a} (written by stage '{s.name}')"
                                   " without a barrier or a wait on its flag")
            for s, st, rw in later:
                ordered = ctx.phase[s.name] > ctx.phase[c.name] or (
                    same_rank(ctx, a, st.access) and seq_before(ctx, c.name, s.name))
                if not ordered and decide(ctx, e.loc, f"stage '{c.name}' reads {a}", regions.common, r, rw):
                    ctx.err(st.loc, f"race: stage '{s.name}' stores {st.access} over elements that stage '{c.name}'"
                                    f" reads ({a}) with no barrier between them")
    try:
        cyc = nx.find_cycle(dep)
        ctx.err(ctx.stages[ctx.pos[cyc[0][0]]].loc, "dataflow cycle: " + " -> ".join(u for u, _ in cyc))
    except nx.NetworkXNoCycle:
        pass


def _pull_cover(ctx: Ctx, c: Stage, e: Pull, sc: dict[str, Var]) -> None:
    ploops = {v.name: v for v in e.producer} | {ME: ctx.me(c.loc)}
    r = ctx.region(e.read, sc, f"r:{c.name}")
    w = ctx.region(e.write, ploops, f"pw:{c.name}")
    what = f"stage '{c.name}' pulls {e.read} from {e.source}"
    hit = decide(ctx, e.loc, what, regions.self_overlap, w)
    if hit:
        ctx.err(e.loc, f"{what}: the fused copy stores {ctx.element(e.write.tensor, hit[1])} from several tasks"
                       f" ({hit[0]})")
    hole = decide(ctx, e.loc, what, regions.uncovered, [w], r)
    if hole:
        ctx.err(e.loc, f"{what}, but the fused copy never writes {ctx.element(e.read.tensor, hole)}")


def _in_place(ctx: Ctx, c: Stage, rd: Read, sc: dict[str, Var], by_tensor, dep: nx.DiGraph) -> None:
    """An in-place read (local-in-place): the elements whose copy was local come from the source (covered as a
    pull), the others from the buffer, which the copy stage fills except where it skips exactly those local copies;
    each task's tile lies in one rank's rows, so a task reads either in place or the buffer (and then waits)."""
    e: InPlace = rd.expr
    what = f"stage '{c.name}' reads {e.read} in place from {e.source}"
    if e.read.remote:
        ctx.err(e.loc, f"{what}: the buffer is read on a peer, where this rank's rows are not local")
        return
    if ctx.tensor(e.source.tensor).dtype != ctx.tensor(e.read.tensor).dtype:
        ctx.err(e.loc, f"{what}: one pointer reads either tensor, but their dtypes differ")
    ws = by_tensor.get(e.read.tensor, [])
    cps = {s.name: s for s, _, _ in ws}
    if len(cps) != 1:
        ctx.err(e.loc, f"{what}: '{e.read.tensor}' must be written by exactly one copy stage")
        return
    cp = next(iter(cps.values()))
    pair = (e.source.rank, e.write.rank)
    st = cp.body[0] if len(cp.body) == 1 else None
    if st is None or st.access != e.write or not isinstance(st.value, Load) or st.value.access != e.source or \
            tuple(cp.loops) != tuple(e.producer) or ME not in pair or pair[0] == pair[1] or \
            cp.skip_equal not in ((), (pair,)):
        ctx.err(e.loc, f"{what}: stage '{cp.name}' is not the copy {e.write} = {e.source} skipping at most its"
                       " local tasks")
        return
    if ctx.pos[cp.name] >= ctx.pos[c.name]:
        ctx.err(e.loc, f"stage '{c.name}' reads '{e.read.tensor}' before stage '{cp.name}' writes it")
        return
    dep.add_edge(cp.name, c.name)
    _pull_cover(ctx, c, e, sc)
    d = solving_dim(ctx, e)
    if d is None:
        ctx.err(e.loc, f"{what}: the index of '{e.read.tensor}' does not solve the copy's source rank")
        return
    red = {v.name for v in rd.red}
    aff, tv = e.read.index[d.dim], e.read.tile[d.dim]
    if set(aff.vars) & red:
        ctx.err(e.loc, f"{what}: dim {d.dim} moves inside a reduction, so a task's rows are not one rank's")
        return
    vs = sorted(set(aff.vars) | ({tv} if tv else set()))
    env = regions.grid([sc[v] for v in vs], what)
    n = peers.combinations(env)
    lo, hi = regions.interval(aff, tv, sc, env, n)
    split = np.flatnonzero((lo - d.const) // d.block != (hi - 1 - d.const) // d.block)
    if len(split):
        i = int(split[0])
        ctx.err(e.loc, f"{what}: the tile at {lo[i]}..{hi[i] - 1} of dim {d.dim} straddles two ranks' rows")
        return
    if ctx.flagged:
        ctx.flag_reads.append((c, rd, cp.name))
    elif ctx.phase[cp.name] >= ctx.phase[c.name]:
        ctx.err(e.loc, f"read before flag: {what} without a barrier or a wait on its flag")


def _meets(ctx: Ctx, loc, c: Stage, a, r, rw) -> bool:
    """Whether the read region r and a writer's region rw share an element (undecidable: reported, and yes)."""
    try:
        return regions.common(r, rw) is not None
    except regions.Undecidable:
        decide(ctx, loc, f"stage '{c.name}' reads {a}", regions.common, r, rw)
        return True
