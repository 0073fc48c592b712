"""What every rule of the verifier shares: the graph's derived facts (stages, phases, tensors, flags, kernels),
exact regions of accesses (cached), the reads of a stage with their reductions, and the problems found, each a
located diagnostic (`Ctx.err`: a Loc, a message, the rule that found it).
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from tilec.errors import Diagnostic, Loc, ScheduleError
from tilec.ir import regions
from tilec.ir.graph import (
    FLAGS,
    InPlace,
    Kernel,
    Pull,
    Stage,
    Wait,
    kind_of,
    node_order,
    payload_of,
    program_of,
    sid,
    stages,
    state_of,
    sync,
)
from tilec.ir.regions import Undecidable
from tilec.ir.tiling import DimInverse, invert, rank_of
from tilec.ir.types import ME, Access, Dot, Load, Op, Store, Sum, Tensor, TupleCall, Var


@dataclass(frozen=True)
class Read:
    expr: Load | Pull
    red: tuple[Var, ...]  # the reductions the read sits in, outermost first


@dataclass
class FlagInfo:
    dims: list[DimInverse]
    hits: np.ndarray  # (world, *counters per dim): releases per call
    bad: np.ndarray  # hits != count


class Stop(Exception):
    """A rule found the graph too broken for the rules after it (its one problem: `diagnostic`)."""

    def __init__(self, diagnostic: Diagnostic):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic


class Ctx:
    def __init__(self, g: nx.DiGraph):
        self.g = g
        self.prog = program_of(g)
        self.world = self.prog.world
        self.flagged = sync(g) == FLAGS
        self.problems: list[Diagnostic] = []
        self.rule = "structure"  # the rule running now: the kind of the problems it finds
        self._region: dict[tuple, regions.Region] = {}
        self._scope: dict[str, dict[str, Var]] = {}
        self.flag_info: dict[tuple[str, str], FlagInfo] = {}  # (flag, tensor it counts) ->
        self.flag_reads: list[tuple[Stage, Read, str]] = []  # reads that need a flag wait: (consumer, read, producer)

    def located(self, loc: Loc | None, msg: str) -> Diagnostic:
        """A problem at `loc` (a statement of the program), or at the program's file where none applies."""
        if loc is None or loc.line <= 0:
            loc = Loc(self.prog.file, 0, 0)
        return Diagnostic(loc, msg, self.rule)

    def err(self, loc: Loc | None, msg: str) -> None:
        d = self.located(loc, msg)
        if all((x.loc, x.message) != (d.loc, d.message) for x in self.problems):
            self.problems.append(d)

    # -- derived facts, computed once the structure is sound ----------------------------------------
    def setup(self) -> None:
        g = self.g
        self.stages = stages(g)
        self.pos = {s.name: i for i, s in enumerate(self.stages)}
        self.phase: dict[str, int] = {}
        self.barrier_before: dict[str, bool] = {}
        p, pending = 0, False
        for n in node_order(g):
            if kind_of(g, n) == "barrier":
                p, pending = p + 1, True
            else:
                name = payload_of(g, n).name
                self.phase[name], self.barrier_before[name], pending = p, pending, False
        self.tensors = {d["payload"].name: d["payload"] for _, d in g.nodes(data=True) if d["kind"] == "tensor"}
        self.flags = {d["payload"].name: d["payload"] for _, d in g.nodes(data=True) if d["kind"] == "flag"}
        self.kernels: tuple[Kernel, ...] | None = state_of(g).kernels
        self.kernel_of = {s: i for i, k in enumerate(self.kernels or ()) if isinstance(k, Kernel) for s in k.stages}

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
                        raise Stop(self.located(v.loc, f"stage '{s.name}' has two variables named '{v.name}'"
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


# what a program the verifier cannot decide can be rewritten as: its questions are enumerated per component of
# variables (ir/regions.py), so fewer tasks per component, or fewer elements, fit the limits
REWRITE = "rewrite as fewer, larger tiles (or split the stage), so its tasks enumerate within the verifier's limits"


def reads_of(s: Stage) -> list[Read]:
    """Every Load and Pull of the stage with the reductions around it (a tile function shared by several stores
    is read once)."""
    out: list[Read] = []

    def walk(e, red):
        if isinstance(e, Load | Pull):
            out.append(Read(e, red))
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


def seq_before(ctx: Ctx, a: str, b: str) -> bool:
    """Stage a's tasks on a rank are all done before stage b's start on that rank (without flags)."""
    if ctx.kernels is None:
        return not ctx.flagged and ctx.pos[a] < ctx.pos[b]
    ka, kb = ctx.kernel_of.get(a), ctx.kernel_of.get(b)
    # a kernel of the default stream finishes before the next launch there starts; one on its own stream does not
    return ka is not None and kb is not None and ka < kb and not ctx.kernels[ka].concurrent


def same_rank(ctx: Ctx, read: Access, write: Access) -> bool:
    """Every element is written and read by tasks of the same rank (the one that holds it)."""
    return ctx.world == 1 or (read.rank == ME and write.rank == ME)


def stores_of(ctx: Ctx) -> dict[str, list[tuple[Stage, Store, regions.Region]]]:
    out: dict[str, list] = {}
    for s in ctx.stages:
        for st in s.body:
            out.setdefault(st.access.tensor, []).append(
                (s, st, ctx.region(st.access, ctx.loops(s), f"w:{s.name}", s.skip_equal)))
    return out


def decide(ctx: Ctx, loc, what: str, fn, *args):
    try:
        return fn(*args)
    except Undecidable as e:
        ctx.err(loc, f"cannot prove that {what} is right: {e}; {REWRITE}")
        return None


def solving_dim(ctx: Ctx, e: InPlace) -> DimInverse | None:
    ploops = {v.name: v for v in e.producer} | {ME: ctx.me(e.loc)}
    try:
        dims = invert(e.write, ploops, set(), ctx.world, "an in-place read")
    except ScheduleError:
        return None
    return next((d for d in dims if d.rank_var == e.source.rank and d.rank_coef != 0), None)


def own_rows(ctx: Ctx, e: InPlace, sc: dict[str, Var], env: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Per task (env): whether its tile of the buffer is this rank's own rows, read in place (no wait)."""
    d = solving_dim(ctx, e)
    lo, _ = regions.interval(e.read.index[d.dim], None, sc, env, n)
    return rank_of(lo - d.const, d.rank_coef, d.world) == env[ME]


def read_access(e) -> Access:
    return e.read if isinstance(e, InPlace) else e.access


def stage_waits(g: nx.DiGraph, name: str) -> list[Wait]:
    out = []
    for _u, _, d in g.in_edges(sid(name), data=True):
        if d.get("kind") == "wait":
            out += d["waits"]
    return out


def waited(r, env: dict[str, np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first and last counter of a dim the emitted wait polls (Reach: first element, how far it reaches)."""
    first = np.full(n, r.const, dtype=np.int64)
    for v, k in r.terms:
        first = first + k * env[v]
    last = first + r.fixed
    if r.tile is not None:
        last = last + np.minimum(r.tile.step, r.tile.extent - env[r.tile.name]) - 1
    return r.dim.lin(first, clamp=False), r.dim.lin(last, clamp=False)
