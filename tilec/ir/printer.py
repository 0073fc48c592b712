"""Deterministic text form of the tile dataflow graph (what `tilec show --after PASS` prints; golden-tested)."""

from __future__ import annotations

import networkx as nx

from tilec.ir.graph import (
    InPlace,
    Pull,
    flags,
    kernels_of,
    kind_of,
    node_order,
    passes_run,
    payload_of,
    program_of,
    waits,
)
from tilec.ir.types import ME, Const, Dot, Idx, Load, Op, Sum, TExpr, TupleCall, Var

_INFIX = {"+": "+", "-": "-", "*": "*", "/": "/"}


def fmt_expr(e: TExpr) -> str:
    if isinstance(e, Load):
        return str(e.access)
    if isinstance(e, InPlace):
        return f"in_place({e.source} via {e.read})"
    if isinstance(e, Pull):
        return f"pull({e.source} via {e.read})"
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Idx):
        return f"({e.index})"
    if isinstance(e, TupleCall):
        return f"{e.fn}({', '.join(fmt_expr(a) for a in e.args)})"
    if isinstance(e, Dot):
        return f"({fmt_expr(e.lhs)} @ {fmt_expr(e.rhs)})"
    if isinstance(e, Sum):
        return f"sum {fmt_loop(e.var)}: {fmt_expr(e.body)}"
    if isinstance(e, Op):
        if e.op in _INFIX:
            return f"({fmt_expr(e.args[0])} {_INFIX[e.op]} {fmt_expr(e.args[1])})"
        if e.op == "neg":
            return f"-{fmt_expr(e.args[0])}"
        if e.op == "permute":
            return f"{fmt_expr(e.args[0])}.T" if e.attr == (1, 0) else f"permute({fmt_expr(e.args[0])}, {e.attr})"
        if e.op.endswith("_dim"):
            keep = ", keepdim=1" if e.attr[1] else ""
            return f"{e.op.removesuffix('_dim')}({fmt_expr(e.args[0])}, dim={e.attr[0]}{keep})"
        return f"{e.op.removeprefix('cast_')}({', '.join(fmt_expr(a) for a in e.args)})"
    raise TypeError(e)


def fmt_loop(v: Var) -> str:
    if v.derived is not None:  # a peer or an index piece (ir/peers.py): computed, not looped over
        return f"{v.name} = {v.derived}"
    if v.is_rank:
        return f"{v.name} in ranks"
    return f"{v.name} in {v.extent} by {v.step}"


def print_graph(g: nx.DiGraph) -> str:
    p = program_of(g)
    out = [f"program {p.name}  world={p.world}  " + " ".join(f"{k}={v}" for k, v in (*p.dims, *p.tiles))]
    out.append("passes: " + ", ".join(passes_run(g)))
    for n in sorted(n for n, d in g.nodes(data=True) if d["kind"] == "tensor"):
        t = payload_of(g, n)
        sym = " symmetric" if t.symmetric else ""
        out.append(f"{t.kind:<3} {t.name} : {t.dtype}[{', '.join(map(str, t.shape))}]{sym}")
    kernel_of = {s: k for k in kernels_of(g) for s in k.stages}
    for n in node_order(g):
        if kind_of(g, n) == "barrier":
            out.append("barrier")
            continue
        st = payload_of(g, n)
        k = kernel_of.get(st.name)
        where = f"  [kernel {k.name}]" if k else ""
        if st.transport != "sm":
            where += f"  [transport {st.transport}]"
        note = f"  # {st.note}" if st.note else ""
        skip = "".join(f", {a} != {b}" for a, b in st.skip_equal)
        out.append(f"stage {st.name} over {', '.join(fmt_loop(v) for v in st.loops)}{skip}:{where}{note}")
        for w in waits(g, st.name):
            out.append(f"  wait {w.flag} before reading {w.read}")
        shown: dict[int, list] = {}  # stores of one tile function's results print as one line
        for s in st.body:
            shown.setdefault(id(s.value), []).append(s)
        for group in shown.values():
            value = group[0].value
            if isinstance(value, TupleCall):
                targets = ["_"] * len(value.outs)
                for s in group:
                    targets[s.part] = str(s.access)
                out.append(f"  {', '.join(targets)} = {fmt_expr(value)}")
            else:
                out.append(f"  {group[0].access} = {fmt_expr(value)}")
        rel = [v for _, v, e in g.out_edges(n, data=True) if e["kind"] == "release"]
        for f in sorted(rel):
            out.append(f"  release {f[2:]}")
    for f in flags(g):
        owner = "the writing rank" if f.write.rank == ME else f"rank {f.write.rank} (the destination)"
        key = ", ".join(f.key) or "-"
        out.append(f"flag {f.name}: {f.size} counter(s) [{key}] on {owner}, +{f.count} per call from stage"
                   f" {f.producer} ({f.granularity})")
    for k in kernels_of(g):
        attrs = [a for a, on in (("persistent", k.persistent), ("concurrent", k.concurrent),
                                 ("after-barrier", k.barrier_before)) if on]
        if k.groups:
            attrs.append("programs per stage " + ":".join(str(x) for x in k.groups))
        out.append(f"kernel {k.name}: {', '.join(k.stages)}" + (f"  ({', '.join(attrs)})" if attrs else ""))
    return "\n".join(out) + "\n"
