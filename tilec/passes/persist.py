"""persist: group stages into kernel launches.

merge=False: one kernel per stage. Without flags (bsp) they run one after another with a global barrier where the
  program had one; with flags they are launched concurrently on their own streams as persistent kernels that share
  the GPU's programs (pattern 2, "unfused producer-consumer").
merge=True: the stages between two barriers become one persistent kernel whose programs walk the stages' tasks in
  program order (`for t in range(pid, total, NPROG)`), so every task a program waits on is either done by itself
  earlier or by a co-resident program (pattern 3, "fused sequential").

  Before:  stage gather ...  release Ag.gather;  stage gemm ... wait Ag.gather
  After:   kernel k0_gather_gemm: gather, gemm (persistent)
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from tilec.ir.graph import Kernel

from .base import Pass


@dataclass(frozen=True)
class Persist(Pass):
    merge: bool = False
    name = "persist"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        flagged = bool(g.graph.get("barriers_replaced"))
        groups: list[tuple[list[str], bool]] = []  # (stage names, barrier before)
        pending_barrier = False
        for n in g.graph["order"]:
            d = g.nodes[n]
            if d["kind"] == "barrier":
                pending_barrier = True
                continue
            name = d["payload"].name
            if self.merge and groups and not pending_barrier:
                groups[-1][0].append(name)
            else:
                groups.append(([name], pending_barrier))
            pending_barrier = False
        kernels = []
        for i, (names, barrier) in enumerate(groups):
            persistent = flagged and (self.merge or len(groups) > 1)
            kernels.append(Kernel(f"k{i}_{'_'.join(names)}", tuple(names), persistent,
                                  concurrent=flagged and not self.merge and len(groups) > 1, barrier_before=barrier))
        g.graph["kernels"] = tuple(kernels)
        return g
