"""fold-last: run a consumer stage inside the last arriving task of the producer tiles it reads.

When every task of a memory-bound consumer stage (tile copies, element-wise math, merges and sums: the short
tasks of a tail; not a GEMM) reads the tiles of a fixed group of tasks of one producer stage of the same
persistent kernel (local tiles only), the consumer's wait on the producer's flag becomes an arrival counter per
group: each producer task, after its stores, bumps its group's counter (acq_rel, `td.arrive`), and the task whose
bump completes the group runs the consumer task(s) of that group right there, with no wait. The consumer's tasks
leave the persistent loop, so nothing is queued behind the stream and nobody spins. Counters are epoch-based like
every flag (a group completes at epoch * count).

A group is what the consumer's wait covers: the producer tiles along dims it reads whole (a merge over splits:
`local[b, h]` reads `Os[:, b, h]`) are counted by one counter (the key drops their vars); along every other keyed
dim the read must pick one counter through one of its loop vars, so the consumer tasks of a group are a range of
that var (ir/wait_plan.plan_fold). The verifier checks that every consumer task runs exactly once, in the group
its waits cover. Codegen may let the group's last few arrivals share those tasks where every task of the kernel
has a program (codegen/flags.Flags.arrive); which tasks run, and how often, is the same. At world 1 every peer is
this rank, so pushes and peer reads fold too: flash decode's whole tail (merge, push to itself, combine) then runs
inside the last split tasks of each KV head, and no task waits on another stage's flag.

  Before:  stage split ... release Os+Ls.split;   stage local ... wait Os+Ls.split before reading Os[_a0, b, h, _a1]
  After:   stage split ... release Os+Ls.split:local (16 tasks per counter; the last runs local's tasks of it)
           stage local ... wait Os+Ls.split:local ...  # folded into split
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir import peers
from tilec.ir.builtins import TILE_FNS
from tilec.ir.graph import (
    Flag,
    Fold,
    kernels_of,
    payload_of,
    persisted,
    program_of,
    set_payload,
    sid,
    stage,
    stages,
    state_of,
    update_state,
    waits,
)
from tilec.ir.tiling import flag_size, invert
from tilec.ir.types import ME, Dot, TupleCall, Var, reduction_vars, trips, walk
from tilec.ir.wait_plan import plan_wait, release_signature, task_scope

from .base import Pass
from .verify import fold_problem


def _tail_work(c) -> bool:
    """Memory-bound work: tile copies, element-wise math, sums of loaded tiles (a split-K or split-KV merge, a sum
    over ranks), data-movement tile functions (lse_merge): short tasks that would otherwise queue behind the stream
    and spin. A stage with a GEMM (or attend) keeps its own tasks: run inside one producer task its tiles would lose
    their parallelism (and, specialized, leave the compute programs for the communication ones)."""
    return not any(isinstance(x, Dot) or (isinstance(x, TupleCall) and not TILE_FNS[x.fn].moves_data)
                   for s in c.body for x in walk(s.value))


@dataclass(frozen=True)
class FoldLast(Pass):
    name = "fold-last"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        kernels = kernels_of(g)
        if not persisted(g):
            raise ScheduleError("fold-last runs after persist: it folds stages of one persistent kernel")
        kernel_of = {s: i for i, k in enumerate(kernels) for s in k.stages}
        world = program_of(g).world
        folds = list(state_of(g).folds)
        for c in stages(g):
            ws = waits(g, c.name)
            if c.name not in kernel_of:  # a stage on the copy engines (transport=dma) is in no kernel
                continue
            k = kernels[kernel_of[c.name]]
            if not ws or not k.persistent or len({w.flag for w in ws}) != 1 or not _tail_work(c):
                continue
            f: Flag = payload_of(g, f"f:{ws[0].flag}")
            p = f.producer
            if kernel_of.get(p) != kernel_of[c.name] or k.stages.index(p) >= k.stages.index(c.name):
                continue
            remote = [a.rank for a, _ in ((f.write, ()), *f.also)] + [w.read.rank for w in ws]
            if world > 1 and any(r != ME for r in remote):
                continue  # a peer's tiles: the group's last arrival is on another GPU (at world 1 every rank is this)
            try:
                arrival = self._arrival(g, f, c, ws)
            except ScheduleError:
                continue
            fold = Fold(c.name, p, arrival.name, c.loc)
            trial = self._rewrite(g.copy(), f, arrival, c, fold, shared=not k.groups)
            if fold_problem(trial, fold):  # e.g. a task reads the tiles of two groups: it stays in the loop
                continue
            g = trial
            folds.append(fold)
            update_state(g, folds=tuple(folds))
        update_state(g, folds=tuple(folds))
        return g

    @staticmethod
    def _arrival(g: nx.DiGraph, f: Flag, c, ws) -> Flag:
        """The flag whose counters are the groups: f's key without the vars of dims every read takes whole."""
        world = program_of(g).world
        p = stage(g, f.producer)
        scope = task_scope(c, world)
        red = {v.name for s in c.body for v in reduction_vars(s.value)}
        whole: set[str] = set()
        read = []
        for w in ws:
            if w.tensor not in read:
                read.append(w.tensor)
            for r in plan_wait(g, f, w.read, red, scope, "gpu").reach:
                d = r.dim
                if not r.terms and d.lin(r.const, clamp=False) == 0 and d.lin(r.const + r.most, clamp=False) \
                        == d.size - 1:
                    whole |= {x for x, on in ((d.rank_var, d.key_rank), (d.tile_var, d.key_tile)) if on and x}
        loops = {v.name: v for v in p.loops} | {ME: Var(ME, "me", world, 1, p.loc)}
        members = []
        for t in read:
            m = f.member(t)
            key = tuple(v for v in m.key if v not in whole)
            members.append((m.write, key))
        (write, key), *others = members
        count = trips(v for v in p.loops if v.name not in peers.known_from(set(key) | {write.rank}, loops))
        size = flag_size(invert(write, loops, set(key), world, f"fold of stage '{c.name}'"))
        arrival = Flag(f"{f.name}:{c.name}", write.tensor, p.name, write, key, size, count, f.granularity, f.loc,
                       tuple(others))
        sig = release_signature(arrival, p, world)
        if any(release_signature(arrival.member(t), p, world) != sig for t in read[1:]):
            raise ScheduleError(f"fold of stage '{c.name}' ({c.loc}): its reads are not counted by one counter per"
                                " group")
        return arrival

    @staticmethod
    def _rewrite(g: nx.DiGraph, f: Flag, arrival: Flag, c, fold: Fold, shared: bool = True) -> nx.DiGraph:
        g.graph = dict(g.graph)
        fn, an = f"f:{f.name}", f"f:{arrival.name}"
        g.add_node(an, kind="flag", payload=arrival)
        g.add_edge(sid(f.producer), an, kind="release")
        ws = tuple(replace(w, flag=arrival.name) for w in g.edges[fn, sid(c.name)]["waits"])
        g.remove_edge(fn, sid(c.name))
        g.add_edge(an, sid(c.name), kind="wait", waits=ws)
        if not any(d.get("kind") == "wait" for _, _, d in g.out_edges(fn, data=True)):
            g.remove_node(fn)  # nobody else waits on it: its releases would be wasted atomics
        note = (f"folded into {f.producer}: the last of every {arrival.count} tasks of a group runs it" if
                arrival.count > 1 else f"folded into {f.producer}: the producer task runs it after its stores")
        if shared and arrival.count > 1:  # codegen/flags.Flags.arrive (a specialized kernel's program groups: never)
            note += " (its last few share it where every task of the kernel has a program)"
        set_payload(g, sid(c.name), replace(c, note="; ".join(x for x in (c.note, note) if x)))
        return g
