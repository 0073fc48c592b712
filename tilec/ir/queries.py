"""Questions passes, codegen and the verifier ask of a tile graph (kept in ir/ so none of them imports another)."""

from __future__ import annotations

import networkx as nx

from tilec.ir.graph import Flag, Stage, sid, stages
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Load, Var


def flag_dims(g: nx.DiGraph, f: Flag):
    """The per-dim inverses that define flag `f`'s counters (shared by codegen and the verifier)."""
    prog = g.graph["program"]
    p = g.nodes[sid(f.producer)]["payload"]
    loops = {v.name: v for v in p.loops} | {ME: Var(ME, "me", prog.world, 1, p.loc)}
    return invert(f.write, loops, set(f.key), prog.world, f"flag {f.name}")


def copy_stages(g: nx.DiGraph, single: bool = True) -> list[Stage]:
    """Stages whose body stores plain tile loads (one store when `single`)."""
    return [s for s in stages(g) if (len(s.body) == 1 or not single)
            and all(isinstance(x.value, Load) and x.part is None for x in s.body)]
