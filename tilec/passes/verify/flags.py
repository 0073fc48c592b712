"""Rule flags: a flag belongs to its producer's store (released by that stage alone), its counters are
solvable per element, its size is what its key makes, and every counter is released exactly `count` times per
call on the rank that owns it (a dma stage's chunk sets its counter once); stores sharing a flag bump the same
counter from each task.
"""

from __future__ import annotations

import numpy as np

from tilec.errors import ScheduleError
from tilec.ir import peers, regions
from tilec.ir.graph import DMA, Flag, Stage
from tilec.ir.regions import Undecidable
from tilec.ir.tiling import DimInverse, flag_size, strides

from .context import REWRITE, Ctx, FlagInfo


def check(ctx: Ctx) -> None:
    from tilec.ir.wait_plan import release_signature

    g = ctx.g
    for f in sorted(ctx.flags.values(), key=lambda x: x.name):
        if f.producer not in ctx.pos:
            ctx.err(f.loc, f"missing release: flag {f.name} has no producer stage '{f.producer}'")
            continue
        p = ctx.stages[ctx.pos[f.producer]]
        releasers = [u[2:] for u, _, d in g.in_edges(f"f:{f.name}", data=True) if d.get("kind") == "release"]
        if f.producer not in releasers:
            ctx.err(f.loc, f"missing release: stage '{f.producer}' does not release flag {f.name}")
            continue
        if releasers != [f.producer]:
            other = next(x for x in releasers if x != f.producer)
            ctx.err(f.loc, f"flag {f.name} of stage '{f.producer}' has a release edge from stage '{other}'")
        if len(set(f.tensors)) != len(f.tensors):
            ctx.err(f.loc, f"flag {f.name} counts the stores into one tensor twice ({', '.join(f.tensors)})")
            continue
        infos = {t: _flag_member(ctx, f.member(t), p) for t in f.tensors}  # a shared flag: each store it counts
        if any(i is None for i in infos.values()):
            continue
        sig = release_signature(f, p, ctx.world)
        odd = next((t for t in f.tensors if release_signature(f.member(t), p, ctx.world) != sig), None)
        if odd:  # codegen releases the first store's counter: every other store must map each task to it too
            ctx.err(f.loc, f"flag {f.name} counts stores {f.member(odd).write} and {f.write}, but one release per"
                           " task does not bump the same counter for both")
            continue
        for t, info in infos.items():
            ctx.flag_info[(f.name, t)] = info


def _flag_member(ctx: Ctx, f: Flag, p: Stage) -> FlagInfo | None:
    from tilec.ir.queries import flag_dims

    g = ctx.g
    if f.tensor != f.write.tensor or all(st.access != f.write for st in p.body):
        ctx.err(f.loc, f"flag {f.name} counts stores {f.write} into '{f.tensor}', which stage '{f.producer}'"
                       " does not make")
        return None
    try:
        dims = flag_dims(g, f)
    except ScheduleError as e:
        ctx.err(f.loc, str(e))
        return None
    bad_dim = next((d for d in dims if d.rank_var and d.tile_var and d.extent > d.block), None)
    if bad_dim:
        d = bad_dim
        ctx.err(f.loc, f"flag {f.name}: in dim {d.dim} of {f.write} the tiles of '{d.tile_var}' ({d.extent}"
                       f" elements) overlap those of the next '{d.rank_var}' ({d.block} apart): its"
                       " counters cannot be solved per element")
        return None
    if f.size != flag_size(dims):
        ctx.err(f.loc, f"flag {f.name} has {f.size} counters but its key ({', '.join(f.key)}) makes"
                       f" {flag_size(dims)}")
        return None
    try:
        hits = _hits(ctx, f, p, dims)
    except Undecidable as e:
        ctx.err(f.loc, f"cannot prove that flag {f.name} is released `count` times: {e}; {REWRITE}")
        return None
    if not hits.any():
        ctx.err(f.loc, f"missing release: no task of stage '{f.producer}' releases flag {f.name}")
        return None
    wrong = np.argwhere((hits != f.count) & (hits != 0))
    if len(wrong):
        q, *coords = (int(x) for x in wrong[0])
        ctx.err(f.loc, _count_msg(f, dims, q, coords, int(hits[tuple(wrong[0])])))
        return None
    return FlagInfo(dims, hits, hits != f.count)


def _count_msg(f: Flag, dims, q: int, coords: list[int], h: int) -> str:
    idx = sum(c * s for c, s in zip(coords, strides(dims), strict=True))
    kind = "missing release" if h < f.count else "double release"
    return f"{kind}: flag {f.name}[{idx}] on rank {q} is released {h} time(s) per call, waits expect {f.count}"


def _hits(ctx: Ctx, f: Flag, p: Stage, dims: list[DimInverse]) -> np.ndarray:
    """Releases per call of every counter on every rank: (world, *counters per dim), from the producer's tasks
    on every rank (components of variables multiplied out; variables no counter depends on multiply the count)."""
    dom = ctx.loops(p)
    shape = (ctx.world, *(d.size for d in dims))
    axis_vars = [{f.write.rank}] + [({d.rank_var} if d.key_rank and d.rank_var else set())
                                    | ({d.tile_var} if d.key_tile and d.tile_var else set()) for d in dims]
    axis_vars = [peers.inputs(vs, dom) for vs in axis_vars]  # a peer's inputs vary, it is computed (ir/peers.py)
    hits = np.ones(shape, dtype=np.int64)
    used: set[str] = set()
    for grp, vs in regions.skip_groups(axis_vars, p.skip_equal):  # skipped tasks release nothing
        used |= set(vs)
        env = peers.derive(regions.grid_skip([dom[v] for v in vs], p.skip_equal, f"releases of flag {f.name}"), dom)
        n = peers.combinations(env)
        if not grp:
            hits = hits * n
            continue
        coords = []
        for i in grp:
            if i == 0:
                coords.append(env[f.write.rank])
            else:
                d = dims[i - 1]
                r = env[d.rank_var] if d.key_rank and d.rank_var else 0
                t = env[d.tile_var] // d.step if d.key_tile and d.tile_var else 0
                coords.append(np.zeros(n, dtype=np.int64) + d.lin_of(r, t))
        hist = np.zeros([shape[i] for i in grp], dtype=np.int64)
        np.add.at(hist, tuple(coords), 1)
        hits = hits * hist.reshape([shape[i] if i in grp else 1 for i in range(len(shape))])
    for name, v in dom.items():
        if name not in used:
            hits = hits * v.trips
    if p.transport == DMA:  # the runtime copies a counter's tiles as one chunk, then sets the counter once
        hits = (hits > 0).astype(np.int64)
    return hits
