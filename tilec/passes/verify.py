"""The verifier, run after every pass: it decides, exactly, that the graph computes what the program says on every
rank, or rejects it (VerifyError) naming the `file:line:col` of the statement involved.

Dims are compile-time constants, so every access is a known set of elements on known ranks (ir/regions.py:
enumerated per component of variables, not per task or element). The rules, in order:
  structure  nodes, payloads, names, program order, accesses well formed, kernels name known stages
  accesses   variables in scope, tile extents, in bounds, peers only of symmetric tensors, no stores into inputs;
             a pull reads an input through a copy whose variables the buffer index solves
  kernels    every stage in exactly one kernel (a dma stage in none), kernels in program order, global barriers
             exactly where the program has them and only between kernels
  transport  a dma stage copies tiles whose sources no stage writes, in a graph ordered by flags
  writes     no two tasks (of any stages, on any ranks, pushes included) store one element of one rank's copy in
             one phase (between barriers; at all once flags replace them); every output element is written
  reads      every element a stage reads of a computed tensor, on the rank that holds it, is written by an earlier
             stage and ordered before the read: by a barrier, by program order on that rank (kernels that run one
             after another), or, once flags replace barriers, by a flag wait; no later store races the read
  flags      a flag belongs to its producer's store, its counters are solvable per element, and every counter is
             released exactly `count` times per call on the rank that owns it (a dma stage's chunk, one counter's
             tiles, sets its counter once)
  waits      every wait is emitted (names a read of its stage), covers, as the emitted code computes it, the
             counters of every producer tile of every element read, and waits only on counters released `count`
             times per call
  deadlock   waits only on earlier stages: in a kernel launched before it (both persistent when they overlap) or
             earlier in the same persistent kernel; no wait cycle
Whatever cannot be decided within the enumeration limits is rejected, never accepted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx
import numpy as np

from tilec.errors import Loc, ScheduleError, VerifyError
from tilec.ir import regions
from tilec.ir.graph import (
    BARRIERS,
    DMA,
    FLAGS,
    SM,
    Barrier,
    Flag,
    InPlace,
    Kernel,
    Pull,
    Stage,
    Wait,
    sid,
    stages,
    sync,
)
from tilec.ir.regions import Undecidable
from tilec.ir.tiling import DimInverse, flag_size, invert, strides
from tilec.ir.types import ME, Access, Dot, Load, Op, Store, Sum, Tensor, TupleCall, Var


@dataclass(frozen=True)
class _Read:
    expr: Load | Pull
    red: tuple[Var, ...]  # the reductions the read sits in, outermost first


@dataclass
class _FlagInfo:
    dims: list[DimInverse]
    hits: np.ndarray  # (world, *counters per dim): releases per call
    bad: np.ndarray  # hits != count


class _Stop(Exception):
    """A rule found the graph too broken for the rules after it."""


class _Ctx:
    def __init__(self, g: nx.DiGraph):
        self.g = g
        self.prog = g.graph.get("program")
        self.world = self.prog.world
        self.flagged = sync(g) == FLAGS
        self.problems: list[str] = []
        self._region: dict[tuple, regions.Region] = {}
        self._scope: dict[str, dict[str, Var]] = {}
        self.flag_info: dict[tuple[str, str], _FlagInfo] = {}  # (flag, tensor it counts) ->
        self.flag_reads: list[tuple[Stage, _Read, str]] = []  # reads that need a flag wait: (consumer, read, producer)

    def err(self, loc: Loc | None, msg: str) -> None:
        where = str(loc) if loc is not None and loc.line > 0 else self.prog.file
        text = f"{where}: {msg}"
        if text not in self.problems:
            self.problems.append(text)

    # -- derived facts, computed once the structure is sound ----------------------------------------
    def setup(self) -> None:
        g = self.g
        self.stages = stages(g)
        self.pos = {s.name: i for i, s in enumerate(self.stages)}
        self.phase: dict[str, int] = {}
        self.barrier_before: dict[str, bool] = {}
        p, pending = 0, False
        for n in g.graph["order"]:
            if g.nodes[n]["kind"] == "barrier":
                p, pending = p + 1, True
            else:
                name = g.nodes[n]["payload"].name
                self.phase[name], self.barrier_before[name], pending = p, pending, False
        self.tensors = {d["payload"].name: d["payload"] for _, d in g.nodes(data=True) if d["kind"] == "tensor"}
        self.flags = {d["payload"].name: d["payload"] for _, d in g.nodes(data=True) if d["kind"] == "flag"}
        self.kernels: tuple[Kernel, ...] | None = g.graph.get("kernels")
        self.kernel_of = {s: i for i, k in enumerate(self.kernels or ()) for s in k.stages}

    def me(self, loc) -> Var:
        return Var(ME, "me", self.world, 1, loc)

    def tensor(self, name: str) -> Tensor | None:
        """A tensor of the graph, or of the program for buffers a pass removed (pulls still name them)."""
        t = self.tensors.get(name) if hasattr(self, "tensors") else None
        return t or next((x for x in self.prog.tensors if x.name == name), None)

    def loops(self, s: Stage) -> dict[str, Var]:
        return {v.name: v for v in s.loops} | {ME: self.me(s.loc)}

    def scope(self, s: Stage) -> dict[str, Var]:
        """Loop vars, `rank` and every reduction var of the stage by name."""
        if s.name not in self._scope:
            sc = self.loops(s)
            for r in reads_of(s):
                for v in r.red:
                    if sc.get(v.name, v) != v:
                        raise _Stop(_where(self, v.loc, f"stage '{s.name}' has two variables named '{v.name}'"
                                                        " with different ranges: its accesses are ambiguous"))
                    sc[v.name] = v
            self._scope[s.name] = sc
        return self._scope[s.name]

    def region(self, a: Access, dom: dict[str, Var], key: str, skip: tuple = ()) -> regions.Region:
        k = (key, a, skip)
        if k not in self._region:
            self._region[k] = regions.region(a, dom, self.world, self.tensor(a.tensor).shape, skip=skip)
        return self._region[k]

    def element(self, tensor: str, p: list[int]) -> str:
        return f"{tensor}[{', '.join(map(str, p[1:]))}] on rank {p[0]}"


def _where(ctx: _Ctx, loc, msg: str) -> str:
    return f"{loc if loc is not None and loc.line > 0 else ctx.prog.file}: {msg}"


def reads_of(s: Stage) -> list[_Read]:
    """Every Load and Pull of the stage with the reductions around it (a tile function shared by several stores
    is read once)."""
    out: list[_Read] = []

    def walk(e, red):
        if isinstance(e, Load | Pull):
            out.append(_Read(e, red))
        elif isinstance(e, Sum):
            walk(e.body, (*red, e.var))
        elif isinstance(e, Op | TupleCall):
            for a in e.args:
                walk(a, red)
        elif isinstance(e, Dot):
            walk(e.lhs, red)
            walk(e.rhs, red)

    seen = set()
    for st in s.body:
        if id(st.value) not in seen:
            seen.add(id(st.value))
            walk(st.value, ())
    return out


# ---- structure -------------------------------------------------------------------------------------------


def _structure(ctx: _Ctx) -> None:
    g = ctx.g
    order = g.graph.get("order")
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
    if ctx.problems:
        return
    ctx.setup()
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
    for f in ctx.flags.values():
        for a in (f.write, *(a for a, _ in f.also)):
            _access_form(ctx, a, f.loc, f"flag {f.name} counts stores")
        for t in f.tensors:
            if t not in ctx.tensors:
                ctx.err(f.loc, f"flag {f.name} counts tiles of unknown tensor '{t}'")
    for u, v, d in g.edges(data=True):
        kind = d.get("kind")
        if kind == "wait":
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
        elif kind == "release" and (g.nodes[u].get("kind") != "stage" or g.nodes[v].get("kind") != "flag"):
            ctx.err(None, f"release edge {u} -> {v} does not go from a stage to a flag")
    names = set(ctx.pos)
    for k in ctx.kernels or ():
        if not isinstance(k, Kernel):
            ctx.err(None, "the kernel list holds something that is not a kernel")
            continue
        for s in k.stages:
            if s not in names:
                ctx.err(None, f"kernel {k.name} runs unknown stage '{s}'")


def _access_form(ctx: _Ctx, a, loc, what: str) -> None:
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


# ---- accesses --------------------------------------------------------------------------------------------


def _accesses(ctx: _Ctx) -> None:
    for s in ctx.stages:
        loops, sc = ctx.loops(s), ctx.scope(s)
        for st in s.body:
            a = st.access
            t = ctx.tensor(a.tensor)
            if _in_scope(ctx, a, loops, st.loc, f"stage '{s.name}' writes"):
                _in_bounds(ctx, a, loops, st.loc, f"stage '{s.name}' writes", f"w:{s.name}")
            if t.kind == "in":
                ctx.err(st.loc, f"stage '{s.name}' writes '{t.name}', which is an input")
            if a.remote and not t.symmetric:
                ctx.err(st.loc, f"stage '{s.name}' stores into {a} on a peer, but '{t.name}' is not symmetric")
        for r in reads_of(s):
            e = r.expr
            if isinstance(e, Load):
                a = e.access
                if _in_scope(ctx, a, sc, e.loc, f"stage '{s.name}' reads"):
                    _in_bounds(ctx, a, sc, e.loc, f"stage '{s.name}' reads", f"r:{s.name}")
                if a.remote and not ctx.tensor(a.tensor).symmetric:
                    ctx.err(e.loc, f"stage '{s.name}' reads {a} on a peer, but '{a.tensor}' is not symmetric")
            else:
                _pull_form(ctx, s, e, sc)


def _in_scope(ctx: _Ctx, a: Access, dom: dict[str, Var], loc, what: str) -> bool:
    foreign = sorted(a.vars - set(dom))
    if foreign:
        ctx.err(loc, f"{what} {a}, which uses variables it does not have: {', '.join(foreign)}")
        return False
    ok = True
    if a.rank != ME and not dom[a.rank].is_rank:
        ctx.err(loc, f"{what} {a} on '{a.rank}', which is not a rank variable")
        ok = False
    for d, tv in enumerate(a.tile):
        want = dom[tv].step if tv else 1
        if tv and dom[tv].is_rank:
            ctx.err(loc, f"{what} {a}: '{tv}' spans dim {d} as a tile but is a rank variable")
            ok = False
        elif a.shape[d] != want:
            ctx.err(loc, f"{what} {a}: its tile extent {a.shape[d]} in dim {d} is not {want}, the step of"
                         f" {repr(tv) if tv else 'a single element'}")
            ok = False
    return ok


def _in_bounds(ctx: _Ctx, a: Access, dom: dict[str, Var], loc, what: str, key: str) -> bool:
    try:
        r = ctx.region(a, dom, key)
    except Undecidable as e:
        ctx.err(loc, f"{what} {a}: cannot decide its elements ({e})")
        return False
    lo, hi = regions.bounds(r)
    for i, (x, y, n) in enumerate(zip(lo, hi, r.extent, strict=True)):
        if x < 0 or y > n:
            dim = "the rank" if i == 0 else f"dim {i - 1} of '{a.tensor}'"
            ctx.err(loc, f"{what} {a} out of bounds: {dim} reaches [{x}, {y - 1}] but its size is {n}")
            return False
    return True


def _pull_form(ctx: _Ctx, s: Stage, e: Pull, sc: dict[str, Var]) -> None:
    what = f"stage '{s.name}' pulls {e.read} from {e.source}"
    ploops = {v.name: v for v in e.producer} | {ME: ctx.me(s.loc)}
    src = ctx.tensor(e.source.tensor)
    if e.read.tensor != e.write.tensor:
        ctx.err(e.loc, f"{what}: the read names '{e.read.tensor}' but the fused copy wrote '{e.write.tensor}'")
    if src.kind != "in":
        ctx.err(e.loc, f"{what}: '{src.name}' is computed by the program, and a pull reads it with no flag")
    if e.write.remote and not isinstance(e, InPlace):  # an in-place read's copy may push (into the reader)
        ctx.err(e.loc, f"{what}: the fused copy stored into a peer ({e.write}), not into its own buffer")
    if e.source.remote and not src.symmetric:
        ctx.err(e.loc, f"{what}: '{src.name}' is read on a peer but is not symmetric")
    ok = _in_scope(ctx, e.read, sc, e.loc, what) & _in_scope(ctx, e.write, ploops, e.loc, f"{what}: the copy writes") \
        & _in_scope(ctx, e.source, ploops, e.loc, f"{what}: the copy reads")
    if not ok:
        return
    try:
        invert(e.write, ploops, set(), ctx.world, what)
    except ScheduleError as x:
        ctx.err(e.loc, str(x))
        return
    # the emitted pull solves the copy's variables from the buffer index: one it cannot solve is taken as 0
    unsolved = sorted(v for v in e.source.vars - e.write.vars if v != ME and ploops[v].trips > 1)
    if unsolved:
        ctx.err(e.loc, f"{what}: the buffer index does not determine the copy's {', '.join(unsolved)}")
    for a, dom, key in ((e.read, sc, f"r:{s.name}"), (e.write, ploops, f"pw:{s.name}"),
                        (e.source, ploops, f"ps:{s.name}")):
        _in_bounds(ctx, a, dom, e.loc, what, key)


def _barriers(ctx: _Ctx) -> None:
    if ctx.g.graph.get("sync", BARRIERS) not in (BARRIERS, FLAGS):
        ctx.err(None, f"the graph's sync is {ctx.g.graph['sync']!r}, neither {BARRIERS!r} nor {FLAGS!r}")
    for _, d in ctx.g.nodes(data=True):
        if ctx.flagged and d["kind"] == "barrier":
            ctx.err(d["payload"].loc, "a global barrier is left after replace-barriers")


# ---- kernels ---------------------------------------------------------------------------------------------


def _kernels(ctx: _Ctx) -> None:
    ks = ctx.kernels
    if ks is None:
        return
    names = [s.name for s in ctx.stages if s.transport != DMA]
    ran = [s for k in ks for s in k.stages]
    for k in ks:
        if not k.stages:
            ctx.err(None, f"kernel {k.name} runs no stage")
    for s in ctx.stages:
        n = ran.count(s.name)
        if n != (s.transport != DMA):
            want = "none (the copy engines run it)" if s.transport == DMA else "one"
            ctx.err(s.loc, f"stage '{s.name}' runs in {n} kernels, not {want}")
    if ran != names and sorted(ran) == sorted(names):
        first = next(a for a, b in zip(ran, names, strict=True) if a != b)
        ctx.err(ctx.stages[ctx.pos[first]].loc, f"kernels run the stages in the order {', '.join(ran)}, not in"
                                                f" program order ({', '.join(names)})")
    for k in ks:
        if not k.stages or any(s not in ctx.pos for s in k.stages):
            continue
        loc = ctx.stages[ctx.pos[k.stages[0]]].loc
        first = k.stages[0]
        if k.barrier_before != ctx.barrier_before[first]:
            has = "has" if ctx.barrier_before[first] else "has no"
            ctx.err(loc, f"kernel {k.name} {'waits' if k.barrier_before else 'does not wait'} at a global barrier"
                         f" before it, but the program {has} barrier before stage '{first}'")
        for s in k.stages[1:]:
            if ctx.barrier_before[s]:
                ctx.err(loc, f"kernel {k.name} runs stage '{s}' past a global barrier: a kernel cannot wait at one")
        if k.groups and (len(k.groups) != len(k.stages) or not k.persistent):
            ctx.err(loc, f"kernel {k.name} gives {len(k.groups)} program groups to {len(k.stages)} stages"
                         f"{'' if k.persistent else ' and is not persistent'}")


def _transport(ctx: _Ctx) -> None:
    from .transport import dma_blocker

    for s in ctx.stages:
        if s.transport not in (SM, DMA):
            ctx.err(s.loc, f"stage '{s.name}' has transport {s.transport!r}, neither {SM!r} nor {DMA!r}")
        elif s.transport == DMA:
            why = dma_blocker(ctx.g, s)
            if why:
                ctx.err(s.loc, f"stage '{s.name}' cannot run on the copy engines: {why}")


def _seq_before(ctx: _Ctx, a: str, b: str) -> bool:
    """Stage a's tasks on a rank are all done before stage b's start on that rank (without flags)."""
    if ctx.kernels is None:
        return not ctx.flagged and ctx.pos[a] < ctx.pos[b]
    ka, kb = ctx.kernel_of.get(a), ctx.kernel_of.get(b)
    # a kernel of the default stream finishes before the next launch there starts; one on its own stream does not
    return ka is not None and kb is not None and ka < kb and not ctx.kernels[ka].concurrent


def _same_rank(ctx: _Ctx, read: Access, write: Access) -> bool:
    """Every element is written and read by tasks of the same rank (the one that holds it)."""
    return ctx.world == 1 or (read.rank == ME and write.rank == ME)


# ---- writes ----------------------------------------------------------------------------------------------


def _stores(ctx: _Ctx) -> dict[str, list[tuple[Stage, Store, regions.Region]]]:
    out: dict[str, list] = {}
    for s in ctx.stages:
        for st in s.body:
            out.setdefault(st.access.tensor, []).append(
                (s, st, ctx.region(st.access, ctx.loops(s), f"w:{s.name}", s.skip_equal)))
    return out


def _writes(ctx: _Ctx) -> None:
    by_tensor = _stores(ctx)
    read = {_read_access(rd.expr).tensor for c in ctx.stages for rd in reads_of(c) if not isinstance(rd.expr, Pull)
            or isinstance(rd.expr, InPlace)}
    for t, ws in by_tensor.items():
        for s, st, r in ws:
            hit = _decide(ctx, st.loc, f"stage '{s.name}' writes {st.access}", regions.self_overlap, r)
            if hit:
                why, p = hit
                ctx.err(st.loc, f"write conflict: tasks of stage '{s.name}' store {st.access} into the same element"
                                f" {ctx.element(t, p)} ({why})")
        if ctx.flagged and len({s.name for s, _, _ in ws}) > 1 and t in read:
            a, b = sorted({s.name for s, _, _ in ws}, key=ctx.pos.get)[:2]
            ctx.err(ws[-1][1].loc, f"cannot prove that the readers of '{t}' wait for both of its writers, stages"
                                   f" '{a}' and '{b}' (per-tile flags order one producer); rewrite as one stage"
                                   " that writes it")
            continue
        for (s1, st1, r1), (s2, st2, r2) in itertools.combinations(ws, 2):
            if not ctx.flagged and ctx.phase[s1.name] != ctx.phase[s2.name]:
                continue
            p = _decide(ctx, st2.loc, f"stage '{s2.name}' writes {st2.access}", regions.common, r1, r2)
            if p:
                who = f"stage '{s1.name}' stores" if s1 is s2 else f"stages '{s1.name}' and '{s2.name}' store"
                ctx.err(st2.loc, f"write conflict: {who} {ctx.element(t, p)} ({st1.access} and {st2.access}) with"
                                 " no barrier between them")
    # a program may leave parts of an output alone (they keep what the caller put there); a pass may not: every
    # element the program as written stores must still be stored
    written = {}
    for it in ctx.g.graph["program"].items:
        for st in getattr(it, "body", ()):
            if ctx.tensors.get(st.access.tensor) is not None and ctx.tensors[st.access.tensor].kind == "out":
                src = Stage(it.name, it.loops, it.body, it.loc)
                written.setdefault(st.access.tensor, []).append(
                    ctx.region(st.access, ctx.loops(src), f"src:{it.name}"))
    for t in ctx.tensors.values():
        if t.kind != "out" or t.name not in written:
            continue
        ws = by_tensor.get(t.name, [])
        for want in written[t.name]:
            hole = _decide(ctx, t.loc, f"output '{t.name}'", regions.uncovered, [r for _, _, r in ws], want)
            if hole:
                ctx.err(t.loc, f"output '{t.name}' is not written everywhere the program writes it: no stage stores"
                               f" {ctx.element(t.name, hole)}")
                break


def _decide(ctx: _Ctx, loc, what: str, fn, *args):
    try:
        return fn(*args)
    except Undecidable as e:
        ctx.err(loc, f"{what}: cannot decide ({e}); rejected rather than trusted")
        return None


# ---- reads -----------------------------------------------------------------------------------------------


def _reads(ctx: _Ctx) -> None:
    by_tensor = _stores(ctx)
    dep = nx.DiGraph()
    dep.add_nodes_from(ctx.pos)
    for c in ctx.stages:
        sc = ctx.scope(c)
        for rd in reads_of(c):
            e = rd.expr
            if isinstance(e, InPlace):
                _in_place(ctx, c, rd, sc, by_tensor, dep)
                continue
            if isinstance(e, Pull):
                _pull_cover(ctx, c, e, sc)
                continue
            a = e.access
            if ctx.tensor(a.tensor).kind == "in":
                continue
            ws = by_tensor.get(a.tensor, [])
            for s, _, _ in ws:
                if s.name != c.name:
                    dep.add_edge(s.name, c.name)
            if any(s.name == c.name for s, _, _ in ws):
                ctx.err(e.loc, f"stage '{c.name}' reads '{a.tensor}', which it writes itself")
                continue
            prior = [w for w in ws if ctx.pos[w[0].name] < ctx.pos[c.name]]
            later = [w for w in ws if ctx.pos[w[0].name] > ctx.pos[c.name]]
            if not prior:
                who = f"before stage '{later[0][0].name}' writes it" if later else "which no stage writes"
                ctx.err(e.loc, f"stage '{c.name}' reads '{a.tensor}' {who}")
                continue
            r = ctx.region(a, sc, f"r:{c.name}")
            hole = _decide(ctx, e.loc, f"stage '{c.name}' reads {a}", regions.uncovered, [w[2] for w in prior], r)
            if hole:
                ctx.err(e.loc, f"stage '{c.name}' reads {a}, but no earlier stage writes {ctx.element(a.tensor, hole)}")
                continue
            if ctx.flagged:
                ctx.flag_reads.append((c, rd, prior[0][0].name))
                continue
            for s, st, rw in prior:
                ordered = ctx.phase[s.name] < ctx.phase[c.name] or (
                    _same_rank(ctx, a, st.access) and _seq_before(ctx, s.name, c.name))
                if not ordered and _decide(ctx, e.loc, f"stage '{c.name}' reads {a}", regions.common, r, rw):
                    ctx.err(e.loc, f"read before flag: stage '{c.name}' reads {a} (written by stage '{s.name}')"
                                   " without a barrier or a wait on its flag")
            for s, st, rw in later:
                ordered = ctx.phase[s.name] > ctx.phase[c.name] or (
                    _same_rank(ctx, a, st.access) and _seq_before(ctx, c.name, s.name))
                if not ordered and _decide(ctx, e.loc, f"stage '{c.name}' reads {a}", regions.common, r, rw):
                    ctx.err(st.loc, f"race: stage '{s.name}' stores {st.access} over elements that stage '{c.name}'"
                                    f" reads ({a}) with no barrier between them")
    try:
        cyc = nx.find_cycle(dep)
        ctx.err(ctx.stages[ctx.pos[cyc[0][0]]].loc, "dataflow cycle: " + " -> ".join(u for u, _ in cyc))
    except nx.NetworkXNoCycle:
        pass


def _pull_cover(ctx: _Ctx, c: Stage, e: Pull, sc: dict[str, Var]) -> None:
    ploops = {v.name: v for v in e.producer} | {ME: ctx.me(c.loc)}
    r = ctx.region(e.read, sc, f"r:{c.name}")
    w = ctx.region(e.write, ploops, f"pw:{c.name}")
    what = f"stage '{c.name}' pulls {e.read} from {e.source}"
    hit = _decide(ctx, e.loc, what, regions.self_overlap, w)
    if hit:
        ctx.err(e.loc, f"{what}: the fused copy stores {ctx.element(e.write.tensor, hit[1])} from several tasks"
                       f" ({hit[0]})")
    hole = _decide(ctx, e.loc, what, regions.uncovered, [w], r)
    if hole:
        ctx.err(e.loc, f"{what}, but the fused copy never writes {ctx.element(e.read.tensor, hole)}")


def _in_place(ctx: _Ctx, c: Stage, rd: _Read, sc: dict[str, Var], by_tensor, dep: nx.DiGraph) -> None:
    """An in-place read (local-in-place): the elements whose copy was local come from the source (covered as a
    pull), the others from the buffer, which the copy stage fills except where it skips exactly those local copies;
    each task's tile lies in one rank's rows, so a task reads either in place or the buffer (and then waits)."""
    e: InPlace = rd.expr
    what = f"stage '{c.name}' reads {e.read} in place from {e.source}"
    if e.read.remote:
        ctx.err(e.loc, f"{what}: the buffer is read on a peer, where this rank's rows are not local")
        return
    if ctx.tensor(e.source.tensor).dtype != ctx.tensor(e.read.tensor).dtype:
        ctx.err(e.loc, f"{what}: one pointer reads either tensor, but their dtypes differ")
    ws = by_tensor.get(e.read.tensor, [])
    cps = {s.name: s for s, _, _ in ws}
    if len(cps) != 1:
        ctx.err(e.loc, f"{what}: '{e.read.tensor}' must be written by exactly one copy stage")
        return
    cp = next(iter(cps.values()))
    pair = (e.source.rank, e.write.rank)
    st = cp.body[0] if len(cp.body) == 1 else None
    if st is None or st.access != e.write or not isinstance(st.value, Load) or st.value.access != e.source or \
            tuple(cp.loops) != tuple(e.producer) or ME not in pair or pair[0] == pair[1] or \
            cp.skip_equal not in ((), (pair,)):
        ctx.err(e.loc, f"{what}: stage '{cp.name}' is not the copy {e.write} = {e.source} skipping at most its"
                       " local tasks")
        return
    if ctx.pos[cp.name] >= ctx.pos[c.name]:
        ctx.err(e.loc, f"stage '{c.name}' reads '{e.read.tensor}' before stage '{cp.name}' writes it")
        return
    dep.add_edge(cp.name, c.name)
    _pull_cover(ctx, c, e, sc)
    d = _solving_dim(ctx, e)
    if d is None:
        ctx.err(e.loc, f"{what}: the index of '{e.read.tensor}' does not solve the copy's source rank")
        return
    red = {v.name for v in rd.red}
    aff, tv = e.read.index[d.dim], e.read.tile[d.dim]
    if set(aff.vars) & red:
        ctx.err(e.loc, f"{what}: dim {d.dim} moves inside a reduction, so a task's rows are not one rank's")
        return
    vs = sorted(set(aff.vars) | ({tv} if tv else set()))
    env = regions.grid([sc[v] for v in vs], what)
    n = len(next(iter(env.values()))) if env else 1
    lo, hi = regions.interval(aff, tv, sc, env, n)
    split = np.flatnonzero((lo - d.const) // d.rank_coef != (hi - 1 - d.const) // d.rank_coef)
    if len(split):
        i = int(split[0])
        ctx.err(e.loc, f"{what}: the tile at {lo[i]}..{hi[i] - 1} of dim {d.dim} straddles two ranks' rows")
        return
    if ctx.flagged:
        ctx.flag_reads.append((c, rd, cp.name))
    elif ctx.phase[cp.name] >= ctx.phase[c.name]:
        ctx.err(e.loc, f"read before flag: {what} without a barrier or a wait on its flag")


def _solving_dim(ctx: _Ctx, e: InPlace) -> DimInverse | None:
    ploops = {v.name: v for v in e.producer} | {ME: ctx.me(e.loc)}
    try:
        dims = invert(e.write, ploops, set(), ctx.world, "an in-place read")
    except ScheduleError:
        return None
    return next((d for d in dims if d.rank_var == e.source.rank and d.rank_coef > 0), None)


def _own(ctx: _Ctx, e: InPlace, sc: dict[str, Var], env: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Per task (env): whether its tile of the buffer is this rank's own rows, read in place (no wait)."""
    d = _solving_dim(ctx, e)
    lo, _ = regions.interval(e.read.index[d.dim], None, sc, env, n)
    return (lo - d.const) // d.rank_coef == env[ME]


def _read_access(e) -> Access:
    return e.read if isinstance(e, InPlace) else e.access


# ---- flags -----------------------------------------------------------------------------------------------


def _flags(ctx: _Ctx) -> None:
    from tilec.ir.wait_plan import release_signature

    g = ctx.g
    for f in sorted(ctx.flags.values(), key=lambda x: x.name):
        if f.producer not in ctx.pos:
            ctx.err(f.loc, f"missing release: flag {f.name} has no producer stage '{f.producer}'")
            continue
        p = ctx.stages[ctx.pos[f.producer]]
        releasers = [u[2:] for u, _, d in g.in_edges(f"f:{f.name}", data=True) if d.get("kind") == "release"]
        if f.producer not in releasers:
            ctx.err(f.loc, f"missing release: stage '{f.producer}' does not release flag {f.name}")
            continue
        if releasers != [f.producer]:
            other = next(x for x in releasers if x != f.producer)
            ctx.err(f.loc, f"flag {f.name} of stage '{f.producer}' has a release edge from stage '{other}'")
        if len(set(f.tensors)) != len(f.tensors):
            ctx.err(f.loc, f"flag {f.name} counts the stores into one tensor twice ({', '.join(f.tensors)})")
            continue
        infos = {t: _flag_member(ctx, f.member(t), p) for t in f.tensors}  # a shared flag: each store it counts
        if any(i is None for i in infos.values()):
            continue
        sig = release_signature(f, p, ctx.world)
        odd = next((t for t in f.tensors if release_signature(f.member(t), p, ctx.world) != sig), None)
        if odd:  # codegen releases the first store's counter: every other store must map each task to it too
            ctx.err(f.loc, f"flag {f.name} counts stores {f.member(odd).write} and {f.write}, but one release per"
                           " task does not bump the same counter for both")
            continue
        for t, info in infos.items():
            ctx.flag_info[(f.name, t)] = info


def _flag_member(ctx: _Ctx, f: Flag, p: Stage) -> _FlagInfo | None:
    from tilec.ir.queries import flag_dims

    g = ctx.g
    if f.tensor != f.write.tensor or all(st.access != f.write for st in p.body):
        ctx.err(f.loc, f"flag {f.name} counts stores {f.write} into '{f.tensor}', which stage '{f.producer}'"
                       " does not make")
        return None
    try:
        dims = flag_dims(g, f)
    except ScheduleError as e:
        ctx.err(f.loc, str(e))
        return None
    bad_dim = next((d for d in dims if d.rank_var and d.tile_var and d.extent > d.rank_coef), None)
    if bad_dim:
        d = bad_dim
        ctx.err(f.loc, f"flag {f.name}: in dim {d.dim} of {f.write} the tiles of '{d.tile_var}' ({d.extent}"
                       f" elements) overlap those of the next '{d.rank_var}' ({d.rank_coef} apart): its"
                       " counters cannot be solved per element")
        return None
    if f.size != flag_size(dims):
        ctx.err(f.loc, f"flag {f.name} has {f.size} counters but its key ({', '.join(f.key)}) makes"
                       f" {flag_size(dims)}")
        return None
    try:
        hits = _hits(ctx, f, p, dims)
    except Undecidable as e:
        ctx.err(f.loc, f"flag {f.name}: cannot count its releases ({e}); rejected rather than trusted")
        return None
    if not hits.any():
        ctx.err(f.loc, f"missing release: no task of stage '{f.producer}' releases flag {f.name}")
        return None
    wrong = np.argwhere((hits != f.count) & (hits != 0))
    if len(wrong):
        q, *coords = (int(x) for x in wrong[0])
        ctx.err(f.loc, _count_msg(f, dims, q, coords, int(hits[tuple(wrong[0])])))
        return None
    return _FlagInfo(dims, hits, hits != f.count)


def _count_msg(f: Flag, dims, q: int, coords: list[int], h: int) -> str:
    idx = sum(c * s for c, s in zip(coords, strides(dims), strict=True))
    kind = "missing release" if h < f.count else "double release"
    return f"{kind}: flag {f.name}[{idx}] on rank {q} is released {h} time(s) per call, waits expect {f.count}"


def _hits(ctx: _Ctx, f: Flag, p: Stage, dims: list[DimInverse]) -> np.ndarray:
    """Releases per call of every counter on every rank: (world, *counters per dim), from the producer's tasks
    on every rank (components of variables multiplied out; variables no counter depends on multiply the count)."""
    dom = ctx.loops(p)
    shape = (ctx.world, *(d.size for d in dims))
    axis_vars = [{f.write.rank}] + [({d.rank_var} if d.key_rank and d.rank_var else set())
                                    | ({d.tile_var} if d.key_tile and d.tile_var else set()) for d in dims]
    hits = np.ones(shape, dtype=np.int64)
    used: set[str] = set()
    for grp, vs in regions.skip_groups(axis_vars, p.skip_equal):  # skipped tasks release nothing
        used |= set(vs)
        env = regions.grid_skip([dom[v] for v in vs], p.skip_equal, f"releases of flag {f.name}")
        n = len(next(iter(env.values()))) if env else 1
        if not grp:
            hits = hits * n
            continue
        coords = []
        for i in grp:
            if i == 0:
                coords.append(env[f.write.rank])
            else:
                d = dims[i - 1]
                r = env[d.rank_var] if d.key_rank and d.rank_var else 0
                t = env[d.tile_var] // d.step if d.key_tile and d.tile_var else 0
                coords.append(np.zeros(n, dtype=np.int64) + d.lin_of(r, t))
        hist = np.zeros([shape[i] for i in grp], dtype=np.int64)
        np.add.at(hist, tuple(coords), 1)
        hits = hits * hist.reshape([shape[i] if i in grp else 1 for i in range(len(shape))])
    for name, v in dom.items():
        if name not in used:
            hits = hits * v.trips
    if p.transport == DMA:  # the runtime copies a counter's tiles as one chunk, then sets the counter once
        hits = (hits > 0).astype(np.int64)
    return hits


# ---- waits -----------------------------------------------------------------------------------------------


def _waits(ctx: _Ctx) -> None:
    g = ctx.g
    covered: dict[tuple, str | None] = {}  # (consumer, read, wait) -> why the wait does not cover the read
    for c in ctx.stages:
        loads = {_read_access(rd.expr): rd for rd in reads_of(c) if isinstance(rd.expr, Load | InPlace)}
        for w in _stage_waits(g, c.name):
            f = ctx.flags.get(w.flag)
            if f is None:
                ctx.err(w.loc, f"stage '{c.name}' waits on unknown flag {w.flag}")
                continue
            if w.tensor != w.read.tensor or w.tensor not in f.tensors:
                ctx.err(w.loc, f"stage '{c.name}' waits on {w.flag}, a flag of '{'+'.join(f.tensors)}', before"
                               f" reading {w.read}")
                continue
            f = f.member(w.tensor)
            if w.producer != f.producer:
                ctx.err(w.loc, f"stage '{c.name}' waits on {w.flag} as released by stage '{w.producer}', but stage"
                               f" '{f.producer}' releases it")
                continue
            rd = loads.get(w.read)
            if rd is None:
                ctx.err(w.loc, f"the wait on {w.flag} before {w.read} is never emitted: stage '{c.name}' reads no tile"
                               f" {w.read} with these tile vars and extents ({_tiles(w.read)})")
                continue
            if (w.flag, w.tensor) not in ctx.flag_info:
                continue  # the flag itself is rejected
            try:
                covered[(c.name, rd, w)] = _wait_check(ctx, c, rd, w, f)
            except Undecidable as e:
                ctx.err(w.loc, f"stage '{c.name}' waits on {w.flag} before reading {w.read}: cannot decide ({e});"
                               " rejected rather than trusted")
                covered[(c.name, rd, w)] = "undecided"
    for c, rd, producer in ctx.flag_reads:
        a = _read_access(rd.expr)
        mine = [w for w in _stage_waits(g, c.name) if w.read == a and w.flag in ctx.flags
                and w.producer == producer == ctx.flags[w.flag].producer and w.tensor == a.tensor]
        if not mine:
            ctx.err(rd.expr.loc, f"read before flag: stage '{c.name}' reads {a} (written by stage '{producer}')"
                                 " without a barrier or a wait on its flag")
            continue
        whys = [covered.get((c.name, rd, w), "its flag is rejected") for w in mine]
        if all(whys):
            ctx.err(rd.expr.loc, f"read before flag: stage '{c.name}' reads {a}, but {whys[0]}")


def _stage_waits(g: nx.DiGraph, name: str) -> list[Wait]:
    out = []
    for _u, _, d in g.in_edges(sid(name), data=True):
        if d.get("kind") == "wait":
            out += d["waits"]
    return out


def _tiles(a: Access) -> str:
    return ", ".join(f"{tv or '-'}:{n}" for tv, n in zip(a.tile, a.shape, strict=True))


def _wait_check(ctx: _Ctx, c: Stage, rd: _Read, w: Wait, f: Flag) -> str | None:
    """Check the wait as the emitter plans it (ir/wait_plan.py): its counters exist and are each released
    `count` times (else it hangs: reported here), and they include the counter of every producer tile of every
    element the read touches in every task (else returns why not)."""
    from tilec.ir.wait_plan import plan_wait

    info = ctx.flag_info[(f.name, f.tensor)]
    sc = ctx.scope(c)
    red = {v.name for v in rd.red}
    read = w.read
    plan = plan_wait(ctx.g, f, read, red, sc, "sys")
    why = None
    # an in-place read waits only in the tasks that read a peer's rows: its tasks are told apart by those rows
    inplace = rd.expr if isinstance(rd.expr, InPlace) else None
    extra: set[str] = set()
    if inplace is not None:
        d0 = _solving_dim(ctx, inplace)
        if d0 is None:
            return "its in-place read is rejected"
        extra = (set(read.index[d0.dim].vars) | {ME}) - red
    for r in plan.reach:
        d = r.dim
        aff, tv = read.index[d.dim], read.tile[d.dim]
        outer = sorted((set(aff.vars) - red) | extra)
        inner = sorted(v for v in set(aff.vars) if v in red)
        env = regions.grid([sc[v] for v in outer + inner], f"the wait on {f.name}")
        n = len(next(iter(env.values()))) if env else 1
        lo, hi = regions.interval(aff, tv, sc, env, n)
        need_lo, need_hi = _lin_span(d, lo, hi - 1)
        first, last = _waited(r, env, n)
        n_in = int(np.prod([sc[v].trips for v in inner], dtype=np.int64))
        shape = (n // n_in, n_in)
        need_lo, need_hi = need_lo.reshape(shape).min(1), need_hi.reshape(shape).max(1)
        first, last = first.reshape(shape)[:, 0], last.reshape(shape)[:, 0]
        waits = ~_own(ctx, inplace, sc, env, n).reshape(shape)[:, 0] if inplace is not None else True
        outside = waits & (first <= last) & ((first < 0) | (last >= d.size))
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            ctx.err(w.loc, f"stage '{c.name}' waits on counters {first[i]}..{last[i]} of dim {d.dim} of flag {f.name},"
                           f" which has {d.size} there: the wait reads past the flag and cannot complete")
            return "its wait reaches past the flag"
        short = waits & ((first > need_lo) | (last < need_hi))
        if short.any() and why is None:
            i = int(np.flatnonzero(short)[0])
            task = ", ".join(f"{v}={int(env[v].reshape(shape)[i, 0])}" for v in outer)
            why = (f"its wait on {f.name} covers counters {first[i]}..{last[i]} of dim {d.dim} where the task"
                   f"{' ' + task if task else ''} reads tiles of counters {need_lo[i]}..{need_hi[i]}")
    if info.bad.any():
        _hang(ctx, c, w, f, plan, sc, red, info, inplace, extra)
    return why


def _lin_span(d: DimInverse, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest counter coordinate of the written elements a..b of one dim."""
    lo, hi = d.lin(a, clamp=False), d.lin(b, clamp=False)
    if d.rank_var and d.key_tile and not d.key_rank:  # the tile number restarts in every rank's block
        cross = (a - d.const) // d.rank_coef != (b - d.const) // d.rank_coef
        lo, hi = np.where(cross, 0, lo), np.where(cross, d.trips - 1, hi)
    return lo, hi


def _waited(r, env: dict[str, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and last counter of a dim the emitted wait polls (Reach: first element, how far it reaches)."""
    first = np.full(n, r.const, dtype=np.int64)
    for v, k in r.terms:
        first = first + k * env[v]
    last = first + r.fixed
    if r.tile is not None:
        last = last + np.minimum(r.tile.step, r.tile.extent - env[r.tile.name]) - 1
    return r.dim.lin(first, clamp=False), r.dim.lin(last, clamp=False)


def _hang(ctx: _Ctx, c: Stage, w: Wait, f: Flag, plan, sc, red: set[str], info: _FlagInfo,
          inplace: InPlace | None = None, extra: set[str] = frozenset()) -> None:
    """Every counter any task polls is released `count` times on the rank the task polls it on (an in-place
    read's tasks over this rank's own rows poll nothing)."""
    read = w.read
    owner_red = read.rank in red
    joint = sorted({v for r in plan.reach for v, _ in r.terms} | {r.tile.name for r in plan.reach if r.tile}
                   | (set() if owner_red else {read.rank}) | set(extra))
    env = regions.grid([sc[v] for v in joint], f"the wait on {f.name}")
    n = len(next(iter(env.values()))) if env else 1
    box_lo = [np.zeros(n, dtype=np.int64) if owner_red else env[read.rank]]
    box_hi = [np.full(n, ctx.world - 1, dtype=np.int64) if owner_red else env[read.rank]]
    reach = {r.dim.dim: r for r in plan.reach}
    for d in info.dims:
        if d.dim in reach:
            first, last = _waited(reach[d.dim], env, n)
        else:
            first = last = np.zeros(n, dtype=np.int64)
        box_lo.append(first)
        box_hi.append(last)
    bad = info.bad
    sat = np.pad(bad.astype(np.int64), [(1, 0)] * bad.ndim)
    for ax in range(bad.ndim):
        sat = np.cumsum(sat, axis=ax)
    total = np.zeros(n, dtype=np.int64)
    for corner in itertools.product((0, 1), repeat=bad.ndim):
        idx = tuple(np.where(hi_side, box_hi[j] + 1, box_lo[j]) for j, hi_side in enumerate(corner))
        total += sat[idx] * (-1) ** (bad.ndim - sum(corner))
    if inplace is not None:
        total[_own(ctx, inplace, sc, env, n)] = 0
    stuck = np.flatnonzero(total > 0)
    if len(stuck):
        i = int(stuck[0])
        sub = bad[tuple(slice(int(box_lo[j][i]), int(box_hi[j][i]) + 1) for j in range(bad.ndim))]
        off = np.argwhere(sub)[0]
        q, *coords = (int(box_lo[j][i] + off[j]) for j in range(bad.ndim))
        h = int(info.hits[(q, *coords)])
        idx = sum(x * s for x, s in zip(coords, strides(info.dims), strict=True))
        ctx.err(w.loc, f"stage '{c.name}' waits on counter {f.name}[{idx}] on rank {q} before reading {read}, which"
                       f" is released {h} time(s) per call, not {f.count}: the wait can never complete")


# ---- deadlock --------------------------------------------------------------------------------------------


def _deadlock(ctx: _Ctx) -> None:
    wg = nx.DiGraph()
    ks = ctx.kernels
    for c in ctx.stages:
        for w in _stage_waits(ctx.g, c.name):
            f = ctx.flags.get(w.flag)
            if f is None or f.producer not in ctx.pos:
                continue
            p = f.producer
            wg.add_edge(c.name, p)
            if p == c.name:
                ctx.err(w.loc, f"stage '{c.name}' waits on its own flag {w.flag}: a program that may not be running")
                continue
            if ctx.pos[p] > ctx.pos[c.name]:
                ctx.err(w.loc, f"stage '{c.name}' waits on stage '{p}', which comes later: a program that may not be"
                               " running")
            if ks is None or p not in ctx.kernel_of or c.name not in ctx.kernel_of:
                continue
            kp, kc = ctx.kernel_of[p], ctx.kernel_of[c.name]
            if kp > kc:
                ctx.err(w.loc, f"stage '{c.name}' (kernel {ks[kc].name}) waits on stage '{p}' of kernel {ks[kp].name},"
                               " which is launched after it")
            elif kp == kc and not ks[kp].persistent:
                ctx.err(w.loc, f"kernel {ks[kp].name} waits on its own programs but is not persistent")
            elif kp < kc and ks[kp].concurrent and not (ks[kp].persistent and ks[kc].persistent):
                lazy = ks[kp] if not ks[kp].persistent else ks[kc]
                ctx.err(w.loc, f"stage '{c.name}' waits on stage '{p}' of a kernel running beside it, but kernel"
                               f" {lazy.name} is not persistent: its programs may hold every SM while the"
                               " producer's programs cannot start")
    try:
        cyc = nx.find_cycle(wg)
        ctx.err(ctx.stages[ctx.pos[cyc[0][0]]].loc, "wait cycle: " + " -> ".join(u for u, _ in cyc))
    except nx.NetworkXNoCycle:
        pass


# ---- folds -----------------------------------------------------------------------------------------------


def _folds(ctx: _Ctx) -> None:
    """fold-last: the consumer runs inside the producer task that completes a group, with no wait of its own, so
    every consumer task must run exactly once, in the group whose counter its waits cover (one counter per task),
    inside the same persistent kernel, and wait on nothing else (an inlined wait could block its producer)."""
    from tilec.ir.graph import Fold
    from tilec.ir.wait_plan import fold_reads, plan_fold

    seen: set[str] = set()
    for fo in ctx.g.graph.get("folds", ()):
        if not isinstance(fo, Fold):
            ctx.err(None, "the fold list holds something that is not a fold")
            continue
        f = ctx.flags.get(fo.flag)
        if fo.consumer not in ctx.pos or fo.producer not in ctx.pos or f is None:
            ctx.err(fo.loc, f"fold of stage '{fo.consumer}' into '{fo.producer}' names an unknown stage or flag")
            continue
        c = ctx.stages[ctx.pos[fo.consumer]]
        what = f"stage '{fo.consumer}' folded into stage '{fo.producer}'"
        if fo.consumer in seen or fo.consumer == fo.producer or f.producer != fo.producer:
            ctx.err(fo.loc, f"{what}: folded twice, into itself, or on a flag ({fo.flag}) another stage releases")
            continue
        seen.add(fo.consumer)
        k = ctx.kernel_of.get(fo.consumer)
        ks = ctx.kernels or ()
        if k is None or k != ctx.kernel_of.get(fo.producer) or not ks[k].persistent or \
                ks[k].stages.index(fo.producer) > ks[k].stages.index(fo.consumer):
            ctx.err(fo.loc, f"{what}: not an earlier stage of the same persistent kernel")
            continue
        if ctx.world > 1 and (f.write.rank != ME or any(a.rank != ME for a, _ in f.also)):
            ctx.err(fo.loc, f"{what}: {fo.flag} counts stores into peers; the last arrival is not on this GPU")
            continue
        ws = _stage_waits(ctx.g, fo.consumer)
        other = next((w for w in ws if w.flag != fo.flag or (w.read.rank != ME and ctx.world > 1)), None)
        if other is not None:
            ctx.err(other.loc, f"{what}: it also waits on {other.flag} before reading {other.read}; run inside its"
                               " producer's task that wait could block the producer")
            continue
        if any((fo.flag, t) not in ctx.flag_info for t in f.tensors) or \
                any(w.tensor not in f.tensors or w.read.tensor != w.tensor for w in ws):
            continue  # the flag or the wait itself is rejected (rules flags and waits)
        try:
            plan = plan_fold(ctx.g, fo)
            why = _fold_groups(ctx, c, fo, plan, fold_reads(ctx.g, fo.consumer, fo.flag))
        except (ScheduleError, Undecidable) as e:
            why = f"{e}; rejected rather than trusted"
        if why:
            ctx.err(fo.loc, f"{what}: {why}")


def fold_problem(g: nx.DiGraph, fo) -> str | None:
    """Why fold `fo` of graph g is unsound (its groups, as _folds checks them), or None: fold-last asks before it
    commits to a fold."""
    from tilec.ir.wait_plan import fold_reads, plan_fold

    ctx = _Ctx(g)
    ctx.setup()
    try:
        return _fold_groups(ctx, ctx.stages[ctx.pos[fo.consumer]], fo, plan_fold(g, fo),
                            fold_reads(g, fo.consumer, fo.flag))
    except (ScheduleError, Undecidable) as e:
        return str(e)


def _fold_groups(ctx: _Ctx, c: Stage, fo, plan, reads) -> str | None:
    from tilec.ir.queries import flag_dims
    from tilec.ir.wait_plan import plan_wait

    if ctx.stages[ctx.pos[fo.producer]].skip_equal:  # the groups below count every producer task
        return (f"stage '{fo.producer}' skips some of its tasks (local-in-place), so a group's last arrival may never"
                " come")
    sc = ctx.scope(c)
    order = [v for v in c.loops if v.trips > 1]
    env = regions.grid(order, f"the tasks of stage '{c.name}'")
    n = len(next(iter(env.values()))) if env else 1
    tno = np.zeros(n, dtype=np.int64)
    for v in order:
        tno = tno * v.trips + env[v.name] // v.step
    if plan.order != tuple(order) or sorted(tno.tolist()) != list(range(n)):
        return "its task numbers are not the plain decode order"
    counter = None
    for w, red in reads:  # the one counter each task waits on, the same for every read
        fw = ctx.flags[fo.flag].member(w.tensor)
        wp = plan_wait(ctx.g, fw, w.read, red, sc, "gpu")
        dims = flag_dims(ctx.g, fw)
        st = dict(zip((d.dim for d in dims), strides(dims), strict=True))
        mine = np.zeros(n, dtype=np.int64)
        for r in wp.reach:
            if any(v not in env and sc[v].trips > 1 for v, _ in r.terms):
                return f"its read {w.read} picks counters by a reduction"
            full = {v: env.get(v, np.zeros(n, dtype=np.int64)) for v in sc}
            first, last = _waited(r, full, n)
            if (first != last).any():
                i = int(np.flatnonzero(first != last)[0])
                return f"its task {int(tno[i])} waits on counters {first[i]}..{last[i]} of dim {r.dim.dim} before" \
                       f" reading {w.read}: more than one group"
            mine += first * st[r.dim.dim]
        if counter is not None and (mine != counter).any():
            return f"its reads wait on different counters of {fo.flag} in one task"
        counter = mine
    by_task = dict(zip(tno.tolist(), counter.tolist(), strict=True))
    # the producer side, as emitted: the counter a producer task bumps and the consumer tasks it then runs
    p = ctx.stages[ctx.pos[fo.producer]]
    pl = ctx.loops(p)
    if any(fd.dim.rank_var == ME for fd in plan.dims):
        return "a group is picked by the producer's rank"
    pvars = sorted({x for fd in plan.dims for x in (fd.dim.rank_var, fd.dim.tile_var) if x})
    penv = regions.grid([pl[v] for v in pvars], f"the groups of {fo.flag}")
    pn = len(next(iter(penv.values()))) if penv else 1
    pst = dict(zip((d.dim for d in plan.flag_dims), strides(list(plan.flag_dims)), strict=True))
    runs: dict[int, int] = {}
    groups: dict[int, frozenset] = {}
    for i in range(pn):
        vals = {v: int(penv[v][i]) for v in pvars}
        ctr, ranges = 0, {}
        for fd in plan.dims:
            d = fd.dim
            rv, tv = vals.get(d.rank_var, 0), vals.get(d.tile_var, 0)
            ctr += int(d.lin_of(rv, tv // d.step if d.tile_var else 0)) * pst[d.dim]
            ranges[fd.var.name] = fd.var_range(*fd.producer_span(rv, tv))
        for v in plan.free:
            ranges[v.name] = range(0, v.extent, v.step)
        tasks = frozenset(plan.task_number(dict(zip(ranges, combo, strict=True)))
                          for combo in itertools.product(*ranges.values()))
        if groups.setdefault(ctr, tasks) != tasks:
            return f"producer tasks of counter {ctr} of {fo.flag} would run different consumer tasks"
    for ctr, tasks in groups.items():
        for t in tasks:
            if t not in by_task:
                return f"the group of counter {ctr} would run task {t}, which the stage does not have"
            if by_task[t] != ctr:
                return f"task {t} waits on counter {by_task[t]} but runs when counter {ctr} completes"
            runs[t] = runs.get(t, 0) + 1
    missed = next((t for t in range(n) if runs.get(t, 0) != 1), None)
    if missed is not None:
        return f"its task {missed} runs {runs.get(missed, 0)} times per call, not once"
    return None


RULES = [_accesses, _barriers, _kernels, _transport, _writes, _reads, _flags, _waits, _folds, _deadlock]


def verify(g: nx.DiGraph, after: str = "?") -> None:
    if g.graph.get("program") is None:
        raise VerifyError(after, ["the graph has no program"])
    ctx = _Ctx(g)
    try:
        _structure(ctx)
        if not ctx.problems:
            for rule in RULES:
                rule(ctx)
                if ctx.problems and rule is _accesses:  # the rules below assume accesses in scope and bounds
                    break
    except _Stop as e:
        ctx.problems.append(str(e))
    if ctx.problems:
        raise VerifyError(after, ctx.problems)

