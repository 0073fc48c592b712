"""Questions passes, codegen and the verifier ask of a tile graph (kept in ir/ so none of them imports another)."""

from __future__ import annotations

import networkx as nx

from tilec.ir.gather import gathered
from tilec.ir.graph import Flag, InPlace, Pull, Stage, payload_of, program_of, sid, stages
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Load, Var, reduction_vars, trips


def flag_dims(g: nx.DiGraph, f: Flag):
    """The per-dim inverses that define flag `f`'s counters (shared by codegen and the verifier)."""
    prog = program_of(g)
    p = payload_of(g, sid(f.producer))
    loops = {v.name: v for v in p.loops} | {ME: Var(ME, "me", prog.world, 1, p.loc)}
    return invert(f.write, loops, set(f.key), prog.world, f"flag {f.name}")


def copy_stages(g: nx.DiGraph, single: bool = True) -> list[Stage]:
    """Stages whose body stores plain tile loads (one store when `single`); a gather (ir/gather.py) is no copy, and
    neither is a scatter (a store through an index): pushing one would scatter into a peer, which nothing claims."""
    return [s for s in stages(g) if (len(s.body) == 1 or not single)
            and all(isinstance(x.value, Load) and x.part is None and not gathered(x.value.access)
                    and not gathered(x.access) for x in s.body)]


def pull_rereads(g: nx.DiGraph) -> list[tuple[str, Pull, int, tuple[str, ...]]]:
    """(consumer stage, pull, N, loops) for every fused pull (not in-place reads) that reads its source N > 1 times
    per call: once per value of the consumer's `loops`, the loop variables its read does not depend on (fused-pull
    re-reads each remote A tile of an AG+GEMM once per column block)."""
    out = []
    for c in stages(g):
        red = {v.name for st in c.body for v in reduction_vars(st.value)}
        for r in c.reads():
            if not isinstance(r, Pull) or isinstance(r, InPlace):
                continue
            used = r.read.vars | red
            loops = tuple(v.name for v in c.loops if v.name not in used and v.trips > 1)
            n = trips(v for v in c.loops if v.name in loops)
            if n > 1:
                out.append((c.name, r, n, loops))
    return out
