"""lower: the checked program (BoundProgram) -> the tile dataflow graph. The first pass of every schedule.

Before:  a graph with no nodes whose graph state is the checked program (`program_graph(prog)`):
         stage gather over r in ranks, m in M/W by BM, k in K by BK:  Ag[r*M/W + m, k] = A@r[m, k]
         barrier
         stage gemm over m in M by BM, n in N by BN:  C[m, n] = sum k ...: Ag[m, k] @ B[k, n]
After:   nodes t:A t:B t:C t:Ag, s:gather, b:0, s:gemm; edges t:A -read-> s:gather -write-> t:Ag -read-> s:gemm
         -write-> t:C and program order s:gather -> b:0 -> s:gemm; sync = barriers.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from tilec.errors import TilecError
from tilec.frontend.sema import BarrierIR, BoundProgram
from tilec.ir.graph import Barrier, Stage, new_graph, program_of, rebuild_edges, sid, tid, update_state

from .base import Pass


def program_graph(prog: BoundProgram) -> nx.DiGraph:
    """The graph before lower: no nodes yet, the checked program as its state."""
    return new_graph(prog)


@dataclass(frozen=True)
class Lower(Pass):
    name = "lower"

    def __call__(self, g: nx.DiGraph | BoundProgram) -> nx.DiGraph:
        """Lower a graph from program_graph, or the checked program itself."""
        return super().__call__(g if isinstance(g, nx.DiGraph) else program_graph(g))

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        prog: BoundProgram = program_of(g)
        if g.number_of_nodes():
            raise TilecError("lower: the graph is lowered already")
        for t in prog.tensors:
            g.add_node(tid(t.name), kind="tensor", payload=t)
        order, nb = [], 0
        for it in prog.items:
            if isinstance(it, BarrierIR):
                n = f"b:{nb}"
                g.add_node(n, kind="barrier", payload=Barrier(nb, it.loc))
                nb += 1
            else:
                n = sid(it.name)
                g.add_node(n, kind="stage", payload=Stage(it.name, it.loops, it.body, it.loc))
            order.append(n)
        update_state(g, order=tuple(order))
        rebuild_edges(g)
        return g
