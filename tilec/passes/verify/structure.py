"""Rule structure: the graph is well formed before any other rule reads it. Proves: every node has the
payload its kind says and the name its node id says; the program order names each stage and barrier once; every
store, read, pull and wait is a tensor access whose index, tile vars and extents match the tensor's dims (a tile
var with coefficient 1); wait and release edges join flags and stages; kernels name known stages.
"""

from __future__ import annotations

from tilec.ir.graph import Barrier, Flag, Kernel, Pull, Stage, Wait, state_of
from tilec.ir.types import ME, Access, Store, Tensor

from .context import Ctx, reads_of


def check(ctx: Ctx) -> None:
    """The graph's nodes and order first (the facts every later part reads come from them), then the parts."""
    _nodes(ctx)
    if ctx.problems:
        return
    ctx.setup()
    for part in (_stages, _flags, _edges, _kernels):
        part(ctx)


def _nodes(ctx: Ctx) -> None:
    """Every node is the payload its kind says, named as its id says; the program order names stages and
    barriers of the graph, each once, every stage among them."""
    g = ctx.g
    order = state_of(g).order
    if not isinstance(order, tuple | list):
        ctx.err(None, "the graph has no program order")
        return
    for n in order:
        if n not in g or g.nodes[n].get("kind") not in ("stage", "barrier"):
            ctx.err(None, f"program order names '{n}', which is not a stage or barrier of the graph")
    if len(set(order)) != len(order):
        ctx.err(None, "program order names a node twice")
    kinds = {"stage": Stage, "barrier": Barrier, "tensor": Tensor, "flag": Flag}
    for n, d in g.nodes(data=True):
        kind, p = d.get("kind"), d.get("payload")
        if kind not in kinds or not isinstance(p, kinds[kind]):
            ctx.err(None, f"node '{n}' is not a well-formed {kind or 'node'}")
            continue
        if kind in ("stage", "tensor", "flag") and n != f"{kind[0]}:{p.name}":
            ctx.err(p.loc, f"node '{n}' holds {kind} '{p.name}'")
        if kind == "stage" and n not in order:
            ctx.err(p.loc, f"stage '{p.name}' is not in the program order")


def _stages(ctx: Ctx) -> None:
    """A stage skips at most the tasks of one rank loop equal to `rank`; its body is stores; its stores, reads
    and pulls are well-formed accesses."""
    for s in ctx.stages:
        loops = ctx.loops(s)
        for pair in s.skip_equal:  # codegen drops one value of a rank loop: the one equal to `rank`
            if len(pair) != 2 or ME not in pair or pair[0] == pair[1] or \
                    not all(v in loops and loops[v].is_rank for v in pair):
                ctx.err(s.loc, f"stage '{s.name}' skips the tasks where {pair} are equal: not a rank loop and `rank`")
        if len(s.skip_equal) > 1:
            ctx.err(s.loc, f"stage '{s.name}' skips tasks of several rank loops; codegen drops one")
        for st in s.body:
            if not isinstance(st, Store):
                ctx.err(s.loc, f"stage '{s.name}' has a body item that is not a store")
                continue
            _access_form(ctx, st.access, st.loc, f"stage '{s.name}' writes")
        for r in reads_of(s):
            e = r.expr
            if isinstance(e, Pull):
                for a in (e.read, e.write, e.source):
                    _access_form(ctx, a, e.loc, f"stage '{s.name}' pulls")
            else:
                _access_form(ctx, e.access, e.loc, f"stage '{s.name}' reads")


def _flags(ctx: Ctx) -> None:
    """A flag counts well-formed stores into tensors of the graph."""
    for f in ctx.flags.values():
        for a in (f.write, *(a for a, _ in f.also)):
            _access_form(ctx, a, f.loc, f"flag {f.name} counts stores")
        for t in f.tensors:
            if t not in ctx.tensors:
                ctx.err(f.loc, f"flag {f.name} counts tiles of unknown tensor '{t}'")


def _edges(ctx: Ctx) -> None:
    """A wait edge goes from a flag to a stage and carries waits on that flag before well-formed reads; a
    release edge goes from a stage to a flag."""
    g = ctx.g
    for u, v, d in g.edges(data=True):
        kind = d.get("kind")
        if kind == "release" and (g.nodes[u].get("kind") != "stage" or g.nodes[v].get("kind") != "flag"):
            ctx.err(None, f"release edge {u} -> {v} does not go from a stage to a flag")
        if kind != "wait":
            continue
        if g.nodes[u].get("kind") != "flag" or g.nodes[v].get("kind") != "stage":
            ctx.err(None, f"wait edge {u} -> {v} does not go from a flag to a stage")
            continue
        ws = d.get("waits")
        if not isinstance(ws, tuple | list) or not all(isinstance(w, Wait) for w in ws):
            ctx.err(None, f"wait edge {u} -> {v} carries no waits")
            continue
        for w in ws:
            if f"f:{w.flag}" not in g:
                ctx.err(w.loc, f"stage '{v[2:]}' waits on unknown flag {w.flag}")
            elif w.flag != u[2:]:
                ctx.err(w.loc, f"stage '{v[2:]}' waits on {w.flag} through the edge of flag {u[2:]}")
            _access_form(ctx, w.read, w.loc, f"stage '{v[2:]}' waits before reading")


def _kernels(ctx: Ctx) -> None:
    """The kernel list holds kernels that run stages of the graph."""
    for k in ctx.kernels or ():
        if not isinstance(k, Kernel):
            ctx.err(None, "the kernel list holds something that is not a kernel")
            continue
        for s in k.stages:
            if s not in ctx.pos:
                ctx.err(None, f"kernel {k.name} runs unknown stage '{s}'")


def _access_form(ctx: Ctx, a, loc, what: str) -> None:
    if not isinstance(a, Access):
        ctx.err(loc, f"{what} something that is not a tensor access")
        return
    t = ctx.tensor(a.tensor)
    if t is None:
        ctx.err(loc, f"{what} unknown tensor '{a.tensor}'")
        return
    if not len(a.index) == len(a.tile) == len(a.shape) == len(t.shape):
        ctx.err(loc, f"{what} {a}: '{t.name}' has {len(t.shape)} dims, the access {len(a.index)} indexes,"
                     f" {len(a.tile)} tile vars and {len(a.shape)} extents")
        return
    for d, (aff, tv) in enumerate(zip(a.index, a.tile, strict=True)):
        if tv is not None and aff.coef(tv) != 1:
            ctx.err(loc, f"{what} {a}: tile var '{tv}' of dim {d} must appear in its index with coefficient 1")
