"""persist: group stages into kernel launches.

merge=False: one kernel per stage. Without flags (bsp) they run one after another with a global barrier where the
  program had one; with flags they are launched concurrently on their own streams as persistent kernels that share
  the GPU's programs (pattern 2, "unfused producer-consumer").
merge=True: the stages between two barriers become one persistent kernel whose programs walk the stages' tasks in
  program order (`for t in range(pid, total, NPROG)`), so every task a program waits on is either done by itself
  earlier or by a co-resident program (pattern 3, "fused sequential").
specialize=True (with merge): workgroup specialization (pattern 4): each stage of the kernel gets its own programs,
  data-movement stages (tile copies, sums over ranks, log-sum-exp merges) `comm_share` of them together, compute
  stages the rest in proportion to their tasks. Groups are laid
  out in stage order, so on the interpreter (one program at a time, in order) producers still run first.

  Before:  stage gather ...  release Ag.gather;  stage gemm ... wait Ag.gather
  After:   kernel k0_gather_gemm: gather, gemm (persistent)
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir.builtins import TILE_FNS
from tilec.ir.graph import DMA, FLAGS, Kernel, kind_of, node_order, payload_of, stage, sync, update_state
from tilec.ir.queries import copy_stages
from tilec.ir.types import Sum, TupleCall, trips, walk

from .base import Pass


def _moves_data(g: nx.DiGraph, name: str, copies: set[str]) -> bool:
    """The communication side of workgroup specialization: tile copies, sums over ranks (a reduce-scatter's
    reduction) and log-sum-exp merges; every other stage computes."""
    return name in copies or any(
        (isinstance(x, Sum) and x.var.is_rank) or (isinstance(x, TupleCall) and TILE_FNS[x.fn].moves_data)
        for s in stage(g, name).body for x in walk(s.value))


@dataclass(frozen=True)
class Persist(Pass):
    merge: bool = False
    specialize: bool = False
    comm_share: float = 0.25
    name = "persist"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        flagged = sync(g) == FLAGS
        groups: list[tuple[list[str], bool]] = []  # (stage names, barrier before)
        pending_barrier = False
        for n in node_order(g):
            if kind_of(g, n) == "barrier":
                pending_barrier = True
                continue
            st = payload_of(g, n)
            if st.transport == DMA:  # the copy engines run it (runtime/dma.py), no kernel
                continue
            name = st.name
            if self.merge and groups and not pending_barrier:
                groups[-1][0].append(name)
            else:
                groups.append(([name], pending_barrier))
            pending_barrier = False
        kernels = []
        dma = any(kind_of(g, n) == "stage" and payload_of(g, n).transport == DMA for n in node_order(g))
        for i, (names, barrier) in enumerate(groups):
            # a kernel beside the copy engines is persistent too: its programs take tiles in order as they arrive
            persistent = flagged and (self.merge or len(groups) > 1 or dma)
            shares = self._shares(g, names) if self.specialize else ()
            kernels.append(Kernel(f"k{i}_{'_'.join(names)}", tuple(names), persistent or bool(shares),
                                  concurrent=flagged and not self.merge and len(groups) > 1, barrier_before=barrier,
                                  groups=shares))
        if self.specialize and not any(k.groups for k in kernels):
            raise ScheduleError("specialized does not apply: no kernel has both a data-movement stage (tile copies,"
                                " sums over ranks, merges) and a compute stage to give programs of their own")
        update_state(g, kernels=tuple(kernels))
        return g

    def _shares(self, g: nx.DiGraph, names: list[str]) -> tuple[float, ...]:
        copies = {s.name for s in copy_stages(g, single=False)}
        comm = {n for n in names if _moves_data(g, n, copies)}
        if len(names) < 2 or not (set(names) & comm) or not (set(names) - comm):
            return ()
        ncomm = len(set(names) & comm)
        work = {n: trips(stage(g, n).loops) for n in names if n not in comm}
        total = sum(work.values())
        # at least 1 per mille: a stage of few tasks beside large ones still has a share (and one program at least)
        return tuple(max(1, round(1000 * self.comm_share / ncomm)) if n in comm else
                     max(1, round(1000 * (1 - self.comm_share) * work[n] / total)) for n in names)
