"""The verifier, run after every pass. Each check is a named rule returning problems; any problem is a VerifyError.

Rules: structure (payloads and program order agree), acyclic dataflow, no barrier left after replace-barriers,
every read ordered after its producer (by a barrier or a flag wait), every flag counter released exactly `count`
times per call on the right rank (enumerated over all tasks of all ranks), every wait covers all producer tiles
the read touches (brute force per dim), no wait on a program that may not be running (waits go to earlier
stages, within a kernel only when it is persistent), and no cross-stage wait cycle.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np

from tilec.errors import ScheduleError, VerifyError
from tilec.ir.graph import Pull, flags, stages, waits
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import strides
from tilec.ir.types import ME, Var, reduction_vars


def _structure(g: nx.DiGraph) -> list[str]:
    out = []
    for n in g.graph["order"]:
        if n not in g or g.nodes[n]["kind"] not in ("stage", "barrier"):
            out.append(f"program order names '{n}', which is not a stage or barrier of the graph")
    for n, d in g.nodes(data=True):
        if d["kind"] == "stage" and n not in g.graph["order"]:
            out.append(f"stage '{n[2:]}' is not in the program order")
    if out:  # the rules below walk the program order: stop at a broken one
        return out
    names = {s.name for s in stages(g)}
    for s in stages(g):
        for st in s.body:
            if f"t:{st.access.tensor}" not in g:
                out.append(f"stage '{s.name}' writes unknown tensor '{st.access.tensor}'")
        for r in s.reads():
            t = (r.source if isinstance(r, Pull) else r.access).tensor
            if f"t:{t}" not in g:
                out.append(f"stage '{s.name}' reads unknown tensor '{t}'")
    for k in g.graph.get("kernels", ()):
        for s in k.stages:
            if s not in names:
                out.append(f"kernel {k.name} runs unknown stage '{s}'")
    return out


def _writers(g: nx.DiGraph) -> dict[str, list[str]]:
    w: dict[str, list[str]] = {}
    for s in stages(g):
        for st in s.body:
            w.setdefault(st.access.tensor, []).append(s.name)
    return w


def _dataflow(g: nx.DiGraph) -> list[str]:
    """Acyclic dependencies, and every read ordered after its producer by a barrier or a flag."""
    out = []
    pos = {s.name: i for i, s in enumerate(stages(g))}
    phase, p = {}, 0
    for n in g.graph["order"]:
        if g.nodes[n]["kind"] == "barrier":
            p += 1
        else:
            phase[g.nodes[n]["payload"].name] = p
    writers = _writers(g)
    dep = nx.DiGraph()
    dep.add_nodes_from(pos)
    for c in stages(g):
        # a wait guards exactly the read it names: the same tensor, rank, index and tile extents
        waited = {(w.flag.rsplit(".", 1)[0], w.read) for w in waits(g, c.name)}
        for r in c.reads():
            if isinstance(r, Pull):
                continue
            a = r.access
            for w in writers.get(a.tensor, []):
                if w == c.name:
                    out.append(f"stage '{c.name}' reads '{a.tensor}', which it writes itself")
                    continue
                dep.add_edge(w, c.name)
                if pos[w] > pos[c.name]:
                    out.append(f"stage '{c.name}' reads '{a.tensor}' before stage '{w}' writes it")
                elif (a.tensor, a) not in waited:
                    # without flags only a barrier, or program order on one rank for a local read, orders the two
                    ordered = not g.graph.get("barriers_replaced") and (
                        phase[w] < phase[c.name] or (not a.remote and not _pushes(g, w)))
                    if not ordered:
                        out.append(f"read before flag: stage '{c.name}' reads {a} (written by stage '{w}') without a"
                                   " barrier or a wait on its flag")
    return out + _cycle(dep, "dataflow cycle")


def _cycle(g: nx.DiGraph, what: str) -> list[str]:
    try:
        return [f"{what}: " + " -> ".join(u for u, _ in nx.find_cycle(g))]
    except nx.NetworkXNoCycle:
        return []


def _pushes(g: nx.DiGraph, stage_name: str) -> bool:
    return any(st.access.remote for st in g.nodes[f"s:{stage_name}"]["payload"].body)


def _barriers(g: nx.DiGraph) -> list[str]:
    if g.graph.get("barriers_replaced") and any(d["kind"] == "barrier" for _, d in g.nodes(data=True)):
        return ["a global barrier is left after replace-barriers"]
    return []


def _task_grid(loops: tuple[Var, ...]) -> dict[str, np.ndarray]:
    vals = [np.arange(v.trips) * v.step for v in loops]
    grids = np.meshgrid(*vals, indexing="ij") if vals else []
    return {v.name: gr.ravel() for v, gr in zip(loops, grids, strict=True)}


def _releases(g: nx.DiGraph) -> list[str]:
    """Every counter of every flag is bumped exactly `count` times per call, on the rank that owns it."""

    out = []
    prog = g.graph["program"]
    for f in flags(g):
        if f"s:{f.producer}" not in g:
            out.append(f"missing release: flag {f.name} has no producer stage '{f.producer}'")
            continue
        p = g.nodes[f"s:{f.producer}"]["payload"]
        if not g.has_edge(f"s:{f.producer}", f"f:{f.name}"):
            out.append(f"missing release: stage '{f.producer}' does not release flag {f.name}")
            continue
        try:
            dims = flag_dims(g, f)
        except ScheduleError as e:
            out.append(str(e))
            continue
        st = strides(dims)
        grid = _task_grid(p.loops)
        ntask = len(next(iter(grid.values()))) if grid else 1
        hits = np.zeros((prog.world, f.size), dtype=np.int64)
        for me in range(prog.world):
            env = dict(grid)
            env[ME] = np.full(ntask, me)
            idx = np.zeros(ntask, dtype=np.int64)
            for d, s in zip(dims, st, strict=True):
                r = env[d.rank_var] if d.rank_var else 0
                t = env[d.tile_var] // d.step if d.tile_var else 0
                idx += d.lin_of(r, t) * s
            owner = env[f.write.rank] if f.write.rank != ME else env[ME]
            np.add.at(hits, (owner, idx), 1)
        # a counter no producer task maps to on some rank is never waited on there (coverage checks that every
        # element read is written); one bumped, but not exactly `count` times, is always a bug
        bad = np.argwhere((hits != f.count) & (hits != 0))
        if not hits.any():
            out.append(f"missing release: no task of stage '{f.producer}' releases flag {f.name}")
        if len(bad):
            rk, i = bad[0]
            kind = "missing release" if hits[rk, i] < f.count else "double release"
            out.append(f"{kind}: flag {f.name}[{i}] on rank {rk} is released {hits[rk, i]} time(s) per call,"
                       f" waits expect {f.count}")
    return out


def _coverage(g: nx.DiGraph) -> list[str]:
    """Each wait's counter range [lin(lo), lin(hi)] per dim contains every producer tile the read touches."""

    out = []
    prog = g.graph["program"]
    fl = {f.name: f for f in flags(g)}
    for c in stages(g):
        scope = {v.name: v for v in c.loops}
        for s in c.body:
            scope.update({v.name: v for v in reduction_vars(s.value)})
        scope[ME] = Var(ME, "me", prog.world, 1, c.loc)
        for w in waits(g, c.name):
            f = fl.get(w.flag)
            if f is None:
                out.append(f"stage '{c.name}' waits on unknown flag {w.flag}")
                continue
            if f"s:{f.producer}" not in g:
                continue  # reported by the release rule
            foreign = sorted(set(w.read.vars) - set(scope))
            if foreign:
                out.append(f"stage '{c.name}' waits on {w.flag} for {w.read}, which uses variables it does not have:"
                           f" {', '.join(foreign)}")
                continue
            try:
                dims = flag_dims(g, f)
            except ScheduleError as e:
                out.append(str(e))
                continue
            for d, aff, tv in zip(dims, w.read.index, w.read.tile, strict=True):
                vs = [scope[v] for v in aff.vars]
                for combo in itertools.product(*[range(0, v.extent, v.step) for v in vs]):
                    start = aff.const + sum(k * x for (_, k), x in zip(aff.terms, combo, strict=True))
                    span = scope[tv].step if tv else 1
                    if tv:
                        span = min(span, scope[tv].extent - dict(zip(aff.vars, combo, strict=True))[tv])
                    e = np.arange(start, start + span)
                    if not d.written(e).all():
                        out.append(f"stage '{c.name}' reads elements of {w.read.tensor} (dim {d.dim}, from {start})"
                                   f" that stage '{f.producer}' never writes")
                        break
                    lins = d.lin(e)
                    if lins.min() < d.lin(e[:1])[0] or lins.max() > d.lin(e[-1:])[0]:
                        out.append(f"read before flag: stage '{c.name}' waits on too few counters of {w.flag}"
                                   f" in dim {d.dim}")
                        break
    return out


def _deadlock(g: nx.DiGraph) -> list[str]:
    """Waits only on programs that are certainly running or done: earlier stages, persistent kernels."""
    out = []
    kernels = g.graph.get("kernels")
    pos = {s.name: i for i, s in enumerate(stages(g))}
    wg = nx.DiGraph()
    kernel_of = {s: k for k in kernels or () for s in k.stages}
    for c in stages(g):
        for w in waits(g, c.name):
            p = w.flag.rsplit(".", 1)[1]
            wg.add_edge(c.name, p)
            if p == c.name:
                out.append(f"stage '{c.name}' waits on its own flag {w.flag}: a program that may not be running")
            elif p in pos and pos[p] > pos[c.name]:
                out.append(f"stage '{c.name}' waits on stage '{p}', which comes later: a program that may not be"
                           " running")
            if kernels is not None and kernel_of.get(p) is kernel_of.get(c.name) and p in kernel_of \
                    and not kernel_of[p].persistent:
                out.append(f"kernel {kernel_of[p].name} waits on its own programs but is not persistent")
    return out + _cycle(wg, "wait cycle")


RULES = [_structure, _dataflow, _barriers, _releases, _coverage, _deadlock]


def verify(g: nx.DiGraph, after: str = "?") -> None:
    problems: list[str] = []
    for rule in RULES:
        problems += rule(g)
        if problems and rule is _structure:
            break
    if problems:
        raise VerifyError(after, problems)
