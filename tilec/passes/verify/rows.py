"""Rule rows: data-dependent rows (ir/gather.py) stay sound through every pass.

It proves: every row index and count is read from a 1-D i32 input at an element in scope and in bounds; a gathered
dim spans its whole dim for every dependence (one one-trip variable from 0, so the regions the other rules compare
hold every row the index may hit); a gathered tile's rows are the index tile's; a store through an index (scatter)
writes this rank's own copy along one dim and has its claims buffer (the writes rule leaves its rows'
distinctness to the check every call makes); no copy whose source is gathered was fused into its readers (a pull
solves affine copies only) or moved to the copy engines. What it cannot prove (the index values, the counts, a
scatter's distinct rows) the emitted code checks on every call.
"""

from __future__ import annotations

from tilec.ir.gather import Counted, Gathered, claim_tensor
from tilec.ir.graph import Pull
from tilec.ir.types import Load

from .accesses import _in_bounds, _in_scope
from .context import Ctx, reads_of


def _index(ctx: Ctx, a, dom, loc, what: str, key: str) -> None:
    t = ctx.tensor(a.tensor)
    if t is None or t.dtype != "i32" or len(t.shape) != 1 or t.kind != "in":
        ctx.err(loc, f"{what} {a}: row indexes and counts are read from 1-D i32 inputs")
        return
    if _in_scope(ctx, a, dom, loc, what):
        _in_bounds(ctx, a, dom, loc, what, key)


def check(ctx: Ctx) -> None:
    for s in ctx.stages:
        loops, sc = ctx.loops(s), ctx.scope(s)
        for v in s.loops:
            if isinstance(v, Counted):
                _index(ctx, v.count, loops, s.loc, f"stage '{s.name}' counts the rows of '{v.name}' with",
                       f"c:{s.name}:{v.name}")
        for st in s.body:
            a = st.access
            if isinstance(a, Gathered):  # a scatter: distinct rows, checked by every call in its claims buffer
                if a.remote or len(a.rows) != 1 or ctx.tensor(claim_tensor(a.tensor)) is None:
                    ctx.err(st.loc, f"stage '{s.name}' stores through a row index ({a}): a scatter writes this rank's"
                                    " own copy along one dim, its rows claimed in an i32 buffer of that dim")
                else:
                    _gathered_dims(ctx, s, a, sc, st.loc)
        for r in reads_of(s):
            e = r.expr
            if isinstance(e, Pull) and any(isinstance(a, Gathered) for a in (e.read, e.write, e.source)):
                ctx.err(e.loc, f"stage '{s.name}' pulls {e.read} through a copy of data-dependent rows"
                               f" ({e.source}): a pull solves affine copies only")
                continue
            if not isinstance(e, Load) or not isinstance(e.access, Gathered):
                continue
            a = e.access
            if s.transport != "sm":
                ctx.err(e.loc, f"stage '{s.name}' gathers {a} on the copy engines, which copy affine tiles only")
            _gathered_dims(ctx, s, a, sc, e.loc)


def _gathered_dims(ctx: Ctx, s, a: Gathered, sc, loc) -> None:
    for row in a.rows:
        _index(ctx, row.index, sc, loc, f"stage '{s.name}' indexes the rows of {a} with", f"i:{s.name}:{row.dim}")
        tv = a.tile[row.dim]
        aff = a.index[row.dim]
        var = sc.get(tv)
        if var is None or aff.terms != ((tv, 1),) or aff.const or var.trips != 1 or \
                var.extent != row.size or ctx.tensor(a.tensor).shape[row.dim] != row.size:
            ctx.err(loc, f"stage '{s.name}' accesses {a}: its gathered dim {row.dim} does not span the whole dim, so"
                         " its dependences would miss rows the index may hit")
