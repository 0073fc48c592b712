"""Rule accesses: every access uses only variables in scope (loops, `rank`, its reductions), its tile
extents are its tile vars' steps, it stays in bounds on every rank (exact regions), peers are read or written
only in symmetric tensors, inputs are never stored into; a pull reads an input through a copy whose variables
the buffer index solves.
"""

from __future__ import annotations

from tilec.errors import ScheduleError
from tilec.ir import regions
from tilec.ir.gather import tile_extent
from tilec.ir.graph import InPlace, Pull, Stage
from tilec.ir.regions import Undecidable
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Access, Load, Var

from .context import REWRITE, Ctx, reads_of


def check(ctx: Ctx) -> None:
    for s in ctx.stages:
        loops, sc = ctx.loops(s), ctx.scope(s)
        for st in s.body:
            a = st.access
            t = ctx.tensor(a.tensor)
            if _in_scope(ctx, a, loops, st.loc, f"stage '{s.name}' writes"):
                _in_bounds(ctx, a, loops, st.loc, f"stage '{s.name}' writes", f"w:{s.name}")
            if t.kind == "in":
                ctx.err(st.loc, f"stage '{s.name}' writes '{t.name}', which is an input")
            if a.remote and not t.symmetric:
                ctx.err(st.loc, f"stage '{s.name}' stores into {a} on a peer, but '{t.name}' is not symmetric")
        for r in reads_of(s):
            e = r.expr
            if isinstance(e, Load):
                a = e.access
                if _in_scope(ctx, a, sc, e.loc, f"stage '{s.name}' reads"):
                    _in_bounds(ctx, a, sc, e.loc, f"stage '{s.name}' reads", f"r:{s.name}")
                if a.remote and not ctx.tensor(a.tensor).symmetric:
                    ctx.err(e.loc, f"stage '{s.name}' reads {a} on a peer, but '{a.tensor}' is not symmetric")
            else:
                _pull_form(ctx, s, e, sc)


def _in_scope(ctx: Ctx, a: Access, dom: dict[str, Var], loc, what: str) -> bool:
    foreign = sorted(a.vars - set(dom))
    if foreign:
        ctx.err(loc, f"{what} {a}, which uses variables it does not have: {', '.join(foreign)}")
        return False
    ok = True
    if a.rank != ME and not dom[a.rank].is_rank:
        ctx.err(loc, f"{what} {a} on '{a.rank}', which is not a rank variable")
        ok = False
    for d, tv in enumerate(a.tile):
        want = tile_extent(a, d, dom)
        if tv and dom[tv].is_rank:
            ctx.err(loc, f"{what} {a}: '{tv}' spans dim {d} as a tile but is a rank variable")
            ok = False
        elif a.shape[d] != want:
            ctx.err(loc, f"{what} {a}: its tile extent {a.shape[d]} in dim {d} is not {want}, the step of"
                         f" {repr(tv) if tv else 'a single element'}")
            ok = False
    return ok


def _in_bounds(ctx: Ctx, a: Access, dom: dict[str, Var], loc, what: str, key: str) -> bool:
    try:
        r = ctx.region(a, dom, key)
    except Undecidable as e:
        ctx.err(loc, f"cannot prove that {what} {a} stays in bounds: {e}; {REWRITE}")
        return False
    lo, hi = regions.bounds(r)
    for i, (x, y, n) in enumerate(zip(lo, hi, r.extent, strict=True)):
        if x < 0 or y > n:
            dim = "the rank" if i == 0 else f"dim {i - 1} of '{a.tensor}'"
            ctx.err(loc, f"{what} {a} out of bounds: {dim} reaches [{x}, {y - 1}] but its size is {n}")
            return False
    return True


def _pull_form(ctx: Ctx, s: Stage, e: Pull, sc: dict[str, Var]) -> None:
    what = f"stage '{s.name}' pulls {e.read} from {e.source}"
    ploops = {v.name: v for v in e.producer} | {ME: ctx.me(s.loc)}
    src = ctx.tensor(e.source.tensor)
    if e.read.tensor != e.write.tensor:
        ctx.err(e.loc, f"{what}: the read names '{e.read.tensor}' but the fused copy wrote '{e.write.tensor}'")
    if src.kind != "in":
        ctx.err(e.loc, f"{what}: '{src.name}' is computed by the program, and a pull reads it with no flag")
    if e.write.remote and not isinstance(e, InPlace):  # an in-place read's copy may push (into the reader)
        ctx.err(e.loc, f"{what}: the fused copy stored into a peer ({e.write}), not into its own buffer")
    if e.source.remote and not src.symmetric:
        ctx.err(e.loc, f"{what}: '{src.name}' is read on a peer but is not symmetric")
    ok = _in_scope(ctx, e.read, sc, e.loc, what) & _in_scope(ctx, e.write, ploops, e.loc, f"{what}: the copy writes") \
        & _in_scope(ctx, e.source, ploops, e.loc, f"{what}: the copy reads")
    if not ok:
        return
    try:
        invert(e.write, ploops, set(), ctx.world, what)
    except ScheduleError as x:
        ctx.err(e.loc, str(x))
        return
    # the emitted pull solves the copy's variables from the buffer index: one it cannot solve is taken as 0
    unsolved = sorted(v for v in e.source.vars - e.write.vars if v != ME and ploops[v].trips > 1)
    if unsolved:
        ctx.err(e.loc, f"{what}: the buffer index does not determine the copy's {', '.join(unsolved)}")
    for a, dom, key in ((e.read, sc, f"r:{s.name}"), (e.write, ploops, f"pw:{s.name}"),
                        (e.source, ploops, f"ps:{s.name}")):
        _in_bounds(ctx, a, dom, e.loc, what, key)
