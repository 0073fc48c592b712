"""The task order of a persistent kernel that copies to its peers and computes on what it gathers.

After local-in-place, a kernel `copy (peers only); consumer (in-place reads)` has consumer tiles over this rank's
own rows that wait for nothing. Run as written (every copy task, then every consumer task), the copies take every
SM and nothing overlaps them. Interleaved instead: the copy tasks are spread evenly among this rank's own consumer
tiles (the consumer's tasks rotated so that its first 1/W are this rank's rows), and the consumer's tiles over the
peers' rows come last, by when the peers have pushed them.

With a static stride a program takes every NPROG-th task, and a copy is ~100x shorter than a GEMM tile: spread
over the task numbers, the GEMM tiles would fall to the few programs whose numbers line up with the pattern. So
under a stride the mix is laid out program-major: task pid + j * NPROG is entry pid * R + j of the mix (R = its
length // NPROG), and every program copies and computes in the same proportion. Claimed tasks (the launch's CLAIM,
tilec.device.first_task) need no such layout: a program that finishes a copy claims the next task, so copies and
tiles balance by themselves, and the mix runs in task order. That keeps the tiles running at one moment adjacent in
the consumer's grouped order (they share A and B panels in L2); program-major under claims put the ~NPROG running
tiles 1/NPROG of the mix apart, and each streamed its panels from HBM alone.

The copies go to the peers in the order the peers read them: rank p's consumer reads its own rows, then rank p+1's,
p+2's, ...; so rank q copies to q-1 first, then q-2, ... (`copy_order`). In destination order (0, 1, .., skipping
q), claimed tasks made rank W-1's copies last on every rank, and its first tiles over a peer's rows waited for them.

Deadlock freedom with a persistent grid: a task waits only for a peer's copy tasks, and every copy task comes
before every waiting task in the order, so each program has made all its copies before it first waits (and on
the interpreter, one program per rank, a rank's copies are all made before its first wait).

A consumer in a kernel of its own (flags) or in a program group of its own (specialized) is rotated the same way,
this rank's rows first, while the copy's kernel or programs move the peers' rows.

A stage that pushes its tiles to each rank in turn (GEMM + Reduce-Scatter: `P@o[rank, m, n] = ...` over o in
ranks), merged with the consumer that waits on them, goes round the ranks starting after this one, so its own rows
come last (`own_rows_last`). In program order every rank pushed to rank 0 first and to rank W-1 last: rank W-1's
reduction then waited for every peer's last tiles, and a peer running late held it up (under MPS its call took 1.5x
rank 0's). Rotated, rank o receives the peers' partials of its rows at W-1 different times, each before the end,
and its last partials are its own: no rank waits on a peer's last tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from tilec.ir.graph import InPlace, Kernel, Stage, program_of, stage
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Sum, Var, walk

from . import kir
from .build import add, fdiv, mod, mul, sub


@dataclass(frozen=True)
class Overlap:
    copy: str  # the copy stage (peers only)
    consumer: str
    copies: int  # its tasks
    tiles: int  # the consumer's tasks
    own: int  # of them this rank's own rows: the first `own` after rotating by rank * own
    group_m: int  # the consumer's grouped order: rows of tiles per group, a divisor of a rank's rows

    @property
    def head(self) -> int:
        """Tasks of the interleaved part: every copy and this rank's own tiles."""
        return self.copies + self.own


def overlap_plan(g: nx.DiGraph, k: Kernel, group_m: int, tasks) -> Overlap | None:
    """The interleaved order for kernel k when its consumer's first 1/W tiles (rotated by rank) are provably this
    rank's own rows; `tasks(stage)` counts a stage's tasks. None: keep the written order."""
    world = program_of(g).world
    if k.groups or len(k.stages) != 2 or world < 2 or not k.persistent:
        return None
    cp, c = stage(g, k.stages[0]), stage(g, k.stages[1])
    if not cp.skip_equal or len(cp.body) != 1:
        return None
    group = own_rows_first(g, c, group_m, cp.body[0].access.tensor)
    if group is None:
        return None
    tiles = tasks(c)
    return Overlap(cp.name, c.name, tasks(cp), tiles, tiles // world, group)


def own_rows_first(g: nx.DiGraph, c: Stage, group_m: int, buf: str | None = None) -> int | None:
    """When stage c's in-place reads (of `buf`, or of any buffer) make its first 1/W tasks, rotated by rank * 1/W,
    exactly the tiles over this rank's own rows (which wait for nothing): the rows of tiles per group of its grouped
    order that keep a group within one rank's rows. None: no such rotation is known to hold."""
    world = program_of(g).world
    reads = [x for st in c.body for x in walk(st.value) if isinstance(x, InPlace) and buf in (None, x.read.tensor)]
    if world < 2 or not reads or len(c.loops) != 2 or any(v.is_rank for v in c.loops):
        return None
    m = c.loops[0]  # the rows: the outer loop, or the rows of the grouped order (codegen/tasks.py)
    grouped = group_m > 1 and any(isinstance(x.value, Sum) for x in c.body) and all(v.trips > 1 for v in c.loops)
    group = group_m
    for e in reads:
        ploops = {v.name: v for v in e.producer} | {ME: Var(ME, "me", world, 1, e.loc)}
        d = next((x for x in invert(e.write, ploops, set(), world, "overlap") if x.rank_var == e.source.rank), None)
        if d is None or d.const or e.read.index[d.dim].terms != ((m.name, 1),) or e.read.index[d.dim].const:
            return None
        if d.rank_coef % m.step or m.extent != world * d.rank_coef:
            return None
        rows = d.rank_coef // m.step  # m-tiles per rank
        if grouped:  # a group of rows must not straddle two ranks' rows
            group = max(x for x in range(1, group + 1) if rows % x == 0)
    return group


def own_rows_last(g: nx.DiGraph, k: Kernel, st: Stage) -> bool:
    """Whether stage st of kernel k pushes every tile to the rank its outermost loop names (a loop over the W ranks,
    each value a whole 1/W of its tasks), for a consumer in the same persistent kernel: rotated by (rank + 1) / W of
    its tasks, it then pushes to the peers first and to this rank last."""
    world = program_of(g).world
    if world < 2 or not k.persistent or k.groups or len(k.stages) < 2 or st.name not in k.stages[:-1]:
        return False
    if not st.loops or st.skip_equal or not st.body:
        return False
    o = st.loops[0]
    if not o.is_rank or o.trips != world:
        return False
    return all(s.access.remote and s.access.rank == o.name for s in st.body)


def copy_order(copied: kir.Expr, g: nx.DiGraph, p: Overlap, world: int) -> kir.Expr:
    """The copy task to run as the interleaved mix's copy number `copied`: a copy stage whose outermost loop is the
    destination rank it skips numbers its tasks by destination (peers only: j = 0 .. W-2 stands for
    r = j + (j >= rank)), a block of copies / (W-1) each; block i goes to rank - 1 - i (mod W), the peer that reads
    this rank's rows i-th (its consumer's rotation). Other copy stages keep their order."""
    cp = stage(g, p.copy)
    skip = {x for pair in cp.skip_equal for x in pair} - {ME}
    if world < 3 or not cp.loops or cp.loops[0].name not in skip or p.copies % (world - 1):
        return copied
    per = p.copies // (world - 1)
    block = mod(sub(add("rank", world - 2), fdiv(copied, per)), world - 1)
    return add(mul(block, per), mod(copied, per))
