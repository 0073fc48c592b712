"""replace-barriers: turn global barriers into per-tile ready flags.

For every tensor a stage reads that an earlier stage wrote, the producer bumps a counter per written tile
(release, system scope) on the rank whose copy it wrote, and the consumer waits (acquire) only for the counters of
the tiles it reads, found by inverting the producer's affine write (see ir/tiling.py). Counters carry an epoch:
they are never reset, a consumer in call e waits for e * count.

  Before:  stage gather ...: Ag[r*M/W + m, k] = A@r[m, k]
           barrier
           stage gemm ...:   C[m, n] = sum k: Ag[m, k] @ B[k, n]
  After:   stage gather ...: Ag[r*M/W + m, k] = A@r[m, k];  release Ag.gather[r, m, k]
           stage gemm ...:   wait Ag.gather before reading Ag[m, k];  C[m, n] = ...

granularity: auto (default: a counter per producer tile, except along dims its readers reduce over entirely, where
one counter counts all the tiles: a GEMM waits once per row block instead of once per k-tile), tile (a counter per
producer tile), rank (per source rank: fewer waits, later start), or tensor (one counter: a barrier that only the
readers of this tensor wait on).

One flag per producer tile: where a stage stores several tensors per task and their flags bump the same counter
from the same task (same owner, count, size and release index, as emitted), they become one flag (`Os+Ls.split`,
the others listed in `Flag.also`): one release per task after all its stores, and a reader of any of them waits on
the same counters (a second reader's wait is then already covered, see ir/wait_plan.py).

  Before:  release Os.split; release Ls.split      (two atomics per split task, two waits per local task)
  After:   release Os+Ls.split                     (one of each)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir import peers
from tilec.ir.graph import (
    FLAGS,
    Flag,
    Pull,
    Wait,
    flags,
    kind_of,
    node_order,
    payload_of,
    phases,
    program_of,
    rebuild_edges,
    sid,
    stages,
    update_state,
)
from tilec.ir.tiling import flag_size, invert
from tilec.ir.types import ME, Var, reduction_vars, trips
from tilec.ir.wait_plan import release_signature

from .base import Pass
from .ring_writers import reads_from, ring_writers

GRANULARITIES = ("auto", "tile", "rank", "tensor")


@dataclass(frozen=True)
class ReplaceBarriers(Pass):
    granularity: str = "auto"
    name = "replace-barriers"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        if self.granularity not in GRANULARITIES:
            raise ScheduleError(f"replace-barriers: granularity must be one of {', '.join(GRANULARITIES)}")
        prog = program_of(g)
        writer: dict[str, str] = {}
        # writers of one phase of a tensor no stage reads need no flag: they store disjoint elements (sema and the
        # verifier prove it), so no order between them matters; writers across a barrier need that barrier
        read = {r.access.tensor for c in stages(g) for r in c.reads() if not isinstance(r, Pull)}
        phase = {s.name: i for i, ph in enumerate(phases(g)) for s in ph}
        several = ring_writers(g)  # tensors whose writers store disjoint elements: a read waits on the one it reads
        for s in stages(g):
            for st in s.body:
                t = st.access.tensor
                if t in writer and writer[t] != s.name and (t in read or phase[s.name] != phase[writer[t]]) and \
                        t not in several:
                    raise ScheduleError(f"replace-barriers: '{t}' is written by stages '{writer[t]}' and '{s.name}';"
                                        " per-tile flags cannot order the second write after the first one's readers")
                writer.setdefault(t, s.name)
        made: dict[str, Flag] = {f.name: f for f in flags(g)}
        before = set(made)
        deps = []  # (consumer, read, producer, producer's store)
        reduced: dict[str, set[int]] = {}  # flag -> dims some consumer reads whole inside a reduction
        for c in stages(g):
            red = {v.name for st in c.body for v in reduction_vars(st.value)}
            for r in c.reads():
                if isinstance(r, Pull):
                    continue  # reads an input (fuse-comm only pulls inputs)
                t = r.access.tensor
                if t not in writer or writer[t] == c.name:
                    continue
                if t in several:
                    w = reads_from(g, several[t], c, r.access)
                    if w is None or w == c.name:
                        continue
                    p = payload_of(g, sid(w))
                else:
                    p = payload_of(g, sid(writer[t]))
                st, fname = _covering_store(p, c, r.access, prog)
                deps.append((c, r, p, st, fname))
                reduced.setdefault(fname, set()).update(
                    d for d, aff in enumerate(r.access.index) if set(aff.vars) & red)
        for c, r, p, st, fname in deps:
            if fname not in made:
                made[fname] = self._flag(fname, p, st.access, prog.world, reduced.get(fname, set()))
                g.add_node(f"f:{fname}", kind="flag", payload=made[fname])
                g.add_edge(sid(p.name), f"f:{fname}", kind="release")
            fn, w = f"f:{fname}", Wait(fname, r.access, p.name, st.access.tensor, r.loc)
            if g.has_edge(fn, sid(c.name)):
                if all(x.read != w.read for x in g.edges[fn, sid(c.name)]["waits"]):  # Access equality: index+tiles
                    g.edges[fn, sid(c.name)]["waits"] += (w,)
            else:
                g.add_edge(fn, sid(c.name), kind="wait", waits=(w,))
        self._share(g, [n for n in made if n not in before])
        for n in [n for n in node_order(g) if kind_of(g, n) == "barrier"]:
            g.remove_node(n)
        update_state(g, order=tuple(n for n in node_order(g) if n in g), sync=FLAGS)
        rebuild_edges(g)
        return g

    def _share(self, g: nx.DiGraph, names: list[str]) -> None:
        """Merge the flags of one producer whose releases are the same counter from the same task."""
        world = program_of(g).world
        groups: dict[tuple, list[Flag]] = {}
        for n in names:
            f = payload_of(g, f"f:{n}")
            p = payload_of(g, sid(f.producer))
            groups.setdefault(release_signature(f, p, world), []).append(f)
        for fs in groups.values():
            if len(fs) < 2 or len({f.tensor for f in fs}) < len(fs):  # one store per tensor: Flag.member(tensor)
                continue
            p = payload_of(g, sid(fs[0].producer))
            order = [st.access.tensor for st in p.body]
            fs.sort(key=lambda f: order.index(f.tensor))
            first = fs[0]
            merged = replace(first, name=f"{'+'.join(f.tensor for f in fs)}.{p.name}",
                             also=tuple((f.write, f.key) for f in fs[1:]))
            g.add_node(f"f:{merged.name}", kind="flag", payload=merged)
            g.add_edge(sid(p.name), f"f:{merged.name}", kind="release")
            for f in fs:
                for _, c, d in list(g.out_edges(f"f:{f.name}", data=True)):
                    ws = tuple(replace(w, flag=merged.name) for w in d["waits"])
                    if g.has_edge(f"f:{merged.name}", c):
                        ws = g.edges[f"f:{merged.name}", c]["waits"] + ws
                    g.add_edge(f"f:{merged.name}", c, kind="wait", waits=ws)
                g.remove_node(f"f:{f.name}")

    def _flag(self, name: str, p, write, world: int, reduced: set[int]) -> Flag:
        loops = {v.name: v for v in p.loops} | {ME: Var(ME, "me", world, 1, p.loc)}
        idx_vars = [v for a in write.index for v in a.vars]
        if self.granularity == "tile":
            key = idx_vars
        elif self.granularity == "auto":  # readers that take a whole dim in a reduction wait on it at once
            key = [v for d, a in enumerate(write.index) for v in a.vars if d not in reduced or loops[v].is_rank]
        elif self.granularity == "rank":
            key = [v for v in idx_vars if loops[v].is_rank]
        else:
            key = []
        dims = invert(write, loops, set(key), world, f"replace-barriers for stage '{p.name}'")
        # counters are bumped by every producer task that maps onto them; the destination rank var only selects
        # which rank's counters, so it does not multiply the count
        known = peers.known_from(set(key) | {write.rank}, loops)  # a peer in the key fixes its ring step
        count = trips(v for v in p.loops if v.name not in known)
        if write.rank != ME and ME not in known:  # every rank pushes into the same counters of the peer
            count *= world
        counter = set(key) | {write.rank}
        if not peers.inputs(counter, loops) <= known:  # a peer the algebra cannot solve: count its tasks instead
            count = peers.tasks_per_value(counter, loops)
            if count is None:
                raise ScheduleError(f"replace-barriers: the counters of {write} in stage '{p.name}' ({p.loc}) are"
                                    " bumped by different numbers of tasks (its peer names some ranks more often than"
                                    " others)")
        return Flag(name, write.tensor, p.name, write, tuple(key), flag_size(dims), count, self.granularity, p.loc)


def _covering_store(p, c, read, prog):
    """The store of producer `p` whose elements hold every element consumer `c`'s `read` reaches, and the name
    of its flag: `T.p` for the first store into T, `T.p.i` for its i-th (a task storing two halves of one buffer
    has a flag per half, as each half's counters are solved from its own store). A read reaching the elements of
    several stores is refused with its reason."""
    t = read.tensor
    mine = [(i, x) for i, x in enumerate(x for x in p.body if x.access.tensor == t)]
    if len(mine) == 1:
        return mine[0][1], f"{t}.{p.name}"
    from tilec.ir import regions
    from tilec.ir.types import reduction_vars

    world, shape = prog.world, prog.tensor(t).shape
    me = {ME: Var(ME, "me", world, 1, c.loc)}
    scope = {v.name: v for v in c.loops} | me | {v.name: v for x in c.body for v in reduction_vars(x.value)}
    try:
        want = regions.region(read, scope, world, shape)
        for i, x in mine:
            have = regions.region(x.access, {v.name: v for v in p.loops} | me, world, shape, skip=p.skip_equal)
            if regions.uncovered([have], want) is None:
                return x, f"{t}.{p.name}" + (f".{i}" if i else "")
    except regions.Undecidable as e:
        raise ScheduleError(f"replace-barriers: cannot prove which store of stage '{p.name}' ({p.loc}) holds"
                            f" what stage '{c.name}' ({read.loc}) reads of {read} ({e}); rewrite as one store per"
                            " tensor") from None
    raise ScheduleError(f"replace-barriers: stage '{c.name}' ({read.loc}) reads {read}, which reaches the elements of"
                        f" several stores of stage '{p.name}' into '{t}'; one flag is solved from one store: rewrite"
                        " the read as one per store")
