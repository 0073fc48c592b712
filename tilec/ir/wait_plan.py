"""How a consumer task waits on one flag: which counters, which of its waits are already covered, and which flag
dim is polled as one block. Shared by the emitter (emit.py) and the tax accounting (taxes.py), so what `tilec
taxes` counts is what the generated code does.

A wait covers, per keyed flag dim, the counters from the read's first element to its last one: the non-reduction
index terms give the first, the reduction and tile vars how far the read reaches beyond it (Reach: `top` as the
emitted code computes it, `most` its static upper bound; tilec taxes evaluates the same per task). The dim with
the most counters is polled as one block of atomics (td.wait_all), the others counter by counter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from tilec.ir.graph import Flag, payload_of, program_of
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import DimInverse, invert, strides
from tilec.ir.types import ME, Access, Var

MAX_BLOCK = 1024  # counters polled at once at most (a block wider than this is polled in chunks)


@dataclass(frozen=True)
class Reach:
    """One keyed flag dim of a wait: the read's index terms outside reductions and its constant (the first
    element), and how far the read reaches beyond it: `fixed` elements, plus, when the read's own tile var sits
    outside reductions (`tile`), that tile's extent in this task, min(step, extent - its value) - 1 (a ragged last
    tile reaches less)."""

    dim: DimInverse
    stride: int
    terms: tuple[tuple[str, int], ...]
    const: int
    fixed: int
    tile: Var | None
    aligned: bool  # the read starts on a producer tile boundary in every task

    @property
    def most(self) -> int:
        """At most how far the read reaches beyond its first element, in any task (a tile shorter than its step,
        `_a0 in 3 by 4`, reaches its extent)."""
        return self.fixed + (min(self.tile.step, self.tile.extent) - 1 if self.tile else 0)

    @property
    def top(self) -> int | str:
        """How far the read reaches, as the emitted code computes it (the tile var by name where it matters)."""
        if self.tile is None:
            return self.fixed
        v = self.tile
        top_s = f"tl.minimum({v.step}, {v.extent} - {v.name})" if v.extent % v.step else str(v.step)
        return f"{self.fixed} + {top_s} - 1"

    @property
    def count(self) -> int:
        """At most how many counters of this dim one task reads: elements [a, a + most] touch at most
        ceil((most + 1) / grain) producer tiles when a starts a tile, else ceil(most / grain) + 1."""
        grain = _grain(self.dim)
        n = -(-(self.most + 1) // grain) if self.aligned else -(-self.most // grain) + 1
        return max(1, min(self.dim.size, n))


def _grain(d: DimInverse) -> int:
    return d.step if d.key_tile else d.block


@dataclass(frozen=True)
class WaitPlan:
    key: tuple  # equal keys: the same counters of the same producer, so one wait covers the other
    owner: str  # the rank whose counters: "rank" (this one) or a rank variable
    reach: tuple[Reach, ...]
    block_dim: int | None  # index into reach of the dim polled as a block; None: one counter at a time
    block: int  # counters per block (a power of two)


def plan_wait(g: nx.DiGraph, f: Flag, read: Access, red: set[str], scope: dict[str, Var], flag_scope: str) -> WaitPlan:
    """The plan of one wait on flag `f` before `read`; `red`: the reduction vars the read sits in (the wait covers
    all they reach), `scope`: every var of the consumer task by name."""
    f = f.member(read.tensor)  # a shared flag: its counters as the store of the tensor read defines them
    dims = flag_dims(g, f)
    st = strides(dims)
    reach = []
    for d in (d for d in dims if d.size > 1):
        aff, tv = read.index[d.dim], read.tile[d.dim]
        inner = [(v, k) for v, k in aff.terms if v in red]
        fixed = sum(k * (scope[v].extent - 1) for v, k in inner if v != tv and k > 0)
        if tv and tv in red:
            fixed += scope[tv].extent - 1
        tile = scope[tv] if tv and tv not in red else None
        # a var of one trip is 0 in every task: it does not tell two reads apart
        once = {v for v, _k in aff.terms if v in scope and scope[v].trips == 1 and not scope[v].is_rank}
        terms = tuple(t for t in aff.terms if t not in inner and t[0] not in once)
        # task vars take multiples of their step: the start is a tile boundary when every term and the offset are
        # multiples of the grain (and a rank's block holds whole tiles)
        g_ = _grain(d)
        aligned = (aff.const - d.const) % g_ == 0 and all((k * scope[v].step) % g_ == 0 for v, k in terms) and \
            (not d.rank_var or not d.key_tile or d.block % g_ == 0)
        reach.append(Reach(d, st[dims.index(d)], terms, aff.const, fixed, tile, aligned))
    owner = "rank" if read.rank == ME else read.rank
    # A producer releases all its counters after all its stores (emit.task), so a wait on counters that the same
    # producer tiles bump equally (another tensor it writes, same tiling, same range read) is already satisfied.
    key = (f.producer, f.write.rank, flag_scope, f.count, f.size, owner,
           tuple((replace(r.dim, dim=0), r.stride, r.terms, r.const, r.top) for r in reach))
    counts = [r.count for r in reach]
    block_dim = max(range(len(reach)), key=counts.__getitem__) if counts and max(counts) > 1 else None
    block = min(MAX_BLOCK, 1 << (counts[block_dim] - 1).bit_length()) if block_dim is not None else 1
    return WaitPlan(key, owner, tuple(reach), block_dim, block)


def release_signature(f: Flag, p, world: int) -> tuple:
    """What decides the counter a task of producer stage `p` bumps, as codegen's release computes it (flags.py):
    two stores of one producer with equal signatures have their tiles counted by the same counter, bumped by the
    same tasks the same number of times, so one flag (one release per task) serves both (replace-barriers)."""
    loops = {v.name: v for v in p.loops} | {ME: Var(ME, "me", world, 1, p.loc)}
    dims = invert(f.write, loops, set(f.key), world, f"flag {f.name}")
    return (f.producer, f.write.rank, f.size, f.count, tuple(
        (s, d.key_rank and d.rank_var, d.world if d.key_rank else 0, d.key_tile and d.tile_var,
         d.step if d.key_tile else 0, d.trips if d.key_tile else 0)
        for d, s in zip(dims, strides(dims), strict=True) if d.size > 1))


@dataclass(frozen=True)
class FoldDim:
    """One keyed dim of a fold's arrival counter: the consumer var `var` that picks the group's elements of it
    (the consumer reads `coef * var + const` there). The producer task that completes a group knows the group's
    elements from its own vars: [first, first + extent) with first = dim.const + rank_coef * rank var + tile var."""

    dim: DimInverse
    var: Var
    coef: int
    const: int

    def producer_span(self, rv, tv):
        """The group's elements of this dim: [e0, e1), from the producer's rank-like and tile var values."""
        d = self.dim
        e0 = d.const + (d.rank_coef * rv if d.rank_var else 0) + (tv if d.tile_var else 0)
        return e0, e0 + (min(d.step, d.extent - tv) if d.tile_var else 1)

    def var_range(self, e0: int, e1: int) -> range:
        """The consumer var's values whose read starts in [e0, e1) (emitted as the same arithmetic)."""
        v, k = self.var, self.coef
        lo, hi = -(-max(e0 - self.const, 0) // k), -(-max(e1 - self.const, 0) // k)
        lo = -(-lo // v.step) * v.step
        return range(lo, min(hi, v.extent), v.step)


@dataclass(frozen=True)
class FoldPlan:
    """Which consumer tasks the task completing a group runs: per keyed dim of the counter the consumer var that
    selects them (`dims`), every value of the consumer's other loop vars (`free`); the consumer's task number
    from its vars in decode order (`order`: its loops of more than one trip, the last one fastest)."""

    flag: Flag  # the arrival flag as the first waited read's store defines it
    flag_dims: tuple[DimInverse, ...]  # all its dims (their strides number the counters)
    dims: tuple[FoldDim, ...]
    free: tuple[Var, ...]
    order: tuple[Var, ...]

    def task_number(self, vals: dict[str, int]) -> int:
        t = 0
        for v in self.order:
            t = t * v.trips + vals[v.name] // v.step
        return t


def task_scope(st, world: int) -> dict[str, Var]:
    """Every var of a task of stage `st` by name: its loops, `rank` and its reduction vars."""
    from tilec.ir.types import reduction_vars

    out = {v.name: v for v in st.loops} | {ME: Var(ME, "me", world, 1, st.loc)}
    return out | {v.name: v for s in st.body for v in reduction_vars(s.value)}


def fold_reads(g: nx.DiGraph, consumer: str, flag: str):
    """The consumer's waits on `flag`, each with the reduction vars its read sits in."""
    from tilec.ir.graph import stage, waits
    from tilec.ir.types import reduction_vars

    st = stage(g, consumer)
    red = {v.name for s in st.body for v in reduction_vars(s.value)}
    return [(w, red) for w in waits(g, consumer) if w.flag == flag]


def plan_fold(g: nx.DiGraph, fold) -> FoldPlan:
    """The plan of a fold (ir/graph.Fold), or a ScheduleError saying why the consumer tasks of a group cannot be
    enumerated from the producer's vars. The verifier checks the plan against every task's waits."""
    from tilec.errors import ScheduleError
    from tilec.ir.graph import stage

    c = stage(g, fold.consumer)
    f0: Flag = payload_of(g, f"f:{fold.flag}")
    scope = task_scope(c, program_of(g).world)
    reads = fold_reads(g, fold.consumer, fold.flag)
    if not reads:
        raise ScheduleError(f"fold: stage '{fold.consumer}' does not wait on {fold.flag}")
    w, red = reads[0]
    f = f0.member(w.tensor)
    plan = plan_wait(g, f, w.read, red, scope, "gpu")
    dims = []
    for r in plan.reach:
        d = r.dim
        if (d.rank_var and not d.key_rank) or (d.tile_var and not d.key_tile):
            raise ScheduleError(f"fold: dim {d.dim} of {f.write} is counted in part: a group's elements there are"
                                " not one run")
        # a tile var of one trip (`q in G by G`) is 0 in every task: its tile is the read's fixed width, and the
        # verifier checks that width stays inside one group
        if len(r.terms) != 1 or r.tile is not None and r.tile.trips > 1 and r.tile.name != r.terms[0][0]:
            raise ScheduleError(f"fold: {w.read} picks its counter of dim {d.dim} by {len(r.terms)} vars, not one")
        (v, k), = r.terms
        if v not in scope or scope[v].is_rank or k <= 0 or any(x.var.name == v for x in dims):
            raise ScheduleError(f"fold: {w.read} picks its counter of dim {d.dim} by '{v}', not by one loop var")
        dims.append(FoldDim(d, scope[v], k, r.const))
    picked = {x.var.name for x in dims}
    order = tuple(v for v in c.loops if v.trips > 1)
    return FoldPlan(f, tuple(flag_dims(g, f)), tuple(dims), tuple(v for v in order if v.name not in picked), order)
