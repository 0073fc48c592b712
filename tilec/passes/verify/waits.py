"""Rule waits: every wait is emitted (names a read of its stage), covers, as the emitted code computes it
(ir/wait_plan.py), the counters of every producer tile of every element read, stays inside the flag, and waits
only on counters released `count` times per call; every flagged read has such a wait.
"""

from __future__ import annotations

import itertools

import numpy as np

from tilec.ir import peers, regions
from tilec.ir.graph import Flag, InPlace, Stage, Wait
from tilec.ir.regions import Undecidable
from tilec.ir.tiling import DimInverse, strides
from tilec.ir.types import ME, Access, Load

from .context import REWRITE, Ctx, FlagInfo, Read, own_rows, read_access, reads_of, solving_dim, stage_waits, waited


def check(ctx: Ctx) -> None:
    g = ctx.g
    covered: dict[tuple, str | None] = {}  # (consumer, read, wait) -> why the wait does not cover the read
    for c in ctx.stages:
        loads = {read_access(rd.expr): rd for rd in reads_of(c) if isinstance(rd.expr, Load | InPlace)}
        for w in stage_waits(g, c.name):
            f = ctx.flags.get(w.flag)
            if f is None:
                ctx.err(w.loc, f"stage '{c.name}' waits on unknown flag {w.flag}")
                continue
            if w.tensor != w.read.tensor or w.tensor not in f.tensors:
                ctx.err(w.loc, f"stage '{c.name}' waits on {w.flag}, a flag of '{'+'.join(f.tensors)}', before"
                               f" reading {w.read}")
                continue
            f = f.member(w.tensor)
            if w.producer != f.producer:
                ctx.err(w.loc, f"stage '{c.name}' waits on {w.flag} as released by stage '{w.producer}', but stage"
                               f" '{f.producer}' releases it")
                continue
            rd = loads.get(w.read)
            if rd is None:
                ctx.err(w.loc, f"the wait on {w.flag} before {w.read} is never emitted: stage '{c.name}' reads no tile"
                               f" {w.read} with these tile vars and extents ({_tiles(w.read)})")
                continue
            if (w.flag, w.tensor) not in ctx.flag_info:
                continue  # the flag itself is rejected
            try:
                covered[(c.name, rd, w)] = _wait_check(ctx, c, rd, w, f)
            except Undecidable as e:
                ctx.err(w.loc, f"cannot prove that the wait of stage '{c.name}' on {w.flag} covers {w.read}: {e};"
                               f" {REWRITE}")
                covered[(c.name, rd, w)] = "undecided"
    for c, rd, producer in ctx.flag_reads:
        a = read_access(rd.expr)
        mine = [w for w in stage_waits(g, c.name) if w.read == a and w.flag in ctx.flags
                and w.producer == producer == ctx.flags[w.flag].producer and w.tensor == a.tensor]
        if not mine:
            ctx.err(rd.expr.loc, f"read before flag: stage '{c.name}' reads {a} (written by stage '{producer}')"
                                 " without a barrier or a wait on its flag")
            continue
        whys = [covered.get((c.name, rd, w), "its flag is rejected") for w in mine]
        if all(whys):
            ctx.err(rd.expr.loc, f"read before flag: stage '{c.name}' reads {a}, but {whys[0]}")


def _tiles(a: Access) -> str:
    return ", ".join(f"{tv or '-'}:{n}" for tv, n in zip(a.tile, a.shape, strict=True))


def _wait_check(ctx: Ctx, c: Stage, rd: Read, w: Wait, f: Flag) -> str | None:
    """Check the wait as the emitter plans it (ir/wait_plan.py): its counters exist and are each released
    `count` times (else it hangs: reported here), and they include the counter of every producer tile of every
    element the read touches in every task (else returns why not)."""
    from tilec.ir.wait_plan import plan_wait

    info = ctx.flag_info[(f.name, f.tensor)]
    sc = ctx.scope(c)
    red = {v.name for v in rd.red}
    read = w.read
    plan = plan_wait(ctx.g, f, read, red, sc, "sys")
    why = None
    # an in-place read waits only in the tasks that read a peer's rows: its tasks are told apart by those rows
    inplace = rd.expr if isinstance(rd.expr, InPlace) else None
    extra: set[str] = set()
    if inplace is not None:
        d0 = solving_dim(ctx, inplace)
        if d0 is None:
            return "its in-place read is rejected"
        extra = (set(read.index[d0.dim].vars) | {ME}) - red
    for r in plan.reach:
        d = r.dim
        aff, tv = read.index[d.dim], read.tile[d.dim]
        outer = sorted(peers.inputs((set(aff.vars) - red) | extra, sc))
        inner = sorted(v for v in set(aff.vars) if v in red)
        env = peers.derive(regions.grid([sc[v] for v in outer + inner], f"the wait on {f.name}"), sc)
        n = peers.combinations(env)
        lo, hi = regions.interval(aff, tv, sc, env, n)
        need_lo, need_hi = _lin_span(d, lo, hi - 1)
        first, last = waited(r, env, n)
        n_in = int(np.prod([sc[v].trips for v in inner], dtype=np.int64))
        shape = (n // n_in, n_in)
        need_lo, need_hi = need_lo.reshape(shape).min(1), need_hi.reshape(shape).max(1)
        first, last = first.reshape(shape)[:, 0], last.reshape(shape)[:, 0]
        waits = ~own_rows(ctx, inplace, sc, env, n).reshape(shape)[:, 0] if inplace is not None else True
        outside = waits & (first <= last) & ((first < 0) | (last >= d.size))
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            ctx.err(w.loc, f"stage '{c.name}' waits on counters {first[i]}..{last[i]} of dim {d.dim} of flag {f.name},"
                           f" which has {d.size} there: the wait reads past the flag and cannot complete")
            return "its wait reaches past the flag"
        short = waits & ((first > need_lo) | (last < need_hi))
        if short.any() and why is None:
            i = int(np.flatnonzero(short)[0])
            task = ", ".join(f"{v}={int(env[v].reshape(shape)[i, 0])}" for v in outer)
            why = (f"its wait on {f.name} covers counters {first[i]}..{last[i]} of dim {d.dim} where the task"
                   f"{' ' + task if task else ''} reads tiles of counters {need_lo[i]}..{need_hi[i]}")
    if info.bad.any():
        _hang(ctx, c, w, f, plan, sc, red, info, inplace, extra)
    return why


def _lin_span(d: DimInverse, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest counter coordinate of the written elements a..b of one dim (the coordinate grows with
    the element, reversed orders too: tiling.lin_of; should it shrink, the ends still bound it)."""
    lo, hi = d.lin(a, clamp=False), d.lin(b, clamp=False)
    lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
    if d.rank_var and d.key_tile and not d.key_rank:  # the tile number restarts in every rank's block
        cross = (a - d.const) // d.block != (b - d.const) // d.block
        lo, hi = np.where(cross, 0, lo), np.where(cross, d.trips - 1, hi)
    return lo, hi


def _hang(ctx: Ctx, c: Stage, w: Wait, f: Flag, plan, sc, red: set[str], info: FlagInfo,
          inplace: InPlace | None = None, extra: set[str] = frozenset()) -> None:
    """Every counter any task polls is released `count` times on the rank the task polls it on (an in-place
    read's tasks over this rank's own rows poll nothing)."""
    read = w.read
    owner_red = read.rank in red
    joint = {v for r in plan.reach for v, _ in r.terms} | {r.tile.name for r in plan.reach if r.tile}
    joint = sorted(peers.inputs(joint | (set() if owner_red else {read.rank}) | set(extra), sc))
    env = peers.derive(regions.grid([sc[v] for v in joint], f"the wait on {f.name}"), sc)
    n = peers.combinations(env)
    box_lo = [np.zeros(n, dtype=np.int64) if owner_red else env[read.rank]]
    box_hi = [np.full(n, ctx.world - 1, dtype=np.int64) if owner_red else env[read.rank]]
    reach = {r.dim.dim: r for r in plan.reach}
    for d in info.dims:
        if d.dim in reach:
            first, last = waited(reach[d.dim], env, n)
        else:
            first = last = np.zeros(n, dtype=np.int64)
        box_lo.append(first)
        box_hi.append(last)
    bad = info.bad
    sat = np.pad(bad.astype(np.int64), [(1, 0)] * bad.ndim)
    for ax in range(bad.ndim):
        sat = np.cumsum(sat, axis=ax)
    total = np.zeros(n, dtype=np.int64)
    for corner in itertools.product((0, 1), repeat=bad.ndim):
        idx = tuple(np.where(hi_side, box_hi[j] + 1, box_lo[j]) for j, hi_side in enumerate(corner))
        total += sat[idx] * (-1) ** (bad.ndim - sum(corner))
    if inplace is not None:
        total[own_rows(ctx, inplace, sc, env, n)] = 0
    stuck = np.flatnonzero(total > 0)
    if len(stuck):
        i = int(stuck[0])
        sub = bad[tuple(slice(int(box_lo[j][i]), int(box_hi[j][i]) + 1) for j in range(bad.ndim))]
        off = np.argwhere(sub)[0]
        q, *coords = (int(box_lo[j][i] + off[j]) for j in range(bad.ndim))
        h = int(info.hits[(q, *coords)])
        idx = sum(x * s for x, s in zip(coords, strides(info.dims), strict=True))
        ctx.err(w.loc, f"stage '{c.name}' waits on counter {f.name}[{idx}] on rank {q} before reading {read}, which"
                       f" is released {h} time(s) per call, not {f.count}: the wait can never complete")
