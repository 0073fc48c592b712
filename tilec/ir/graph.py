"""The tile dataflow graph: a networkx DiGraph whose nodes carry immutable payloads.

Nodes (id -> attrs):
  "t:NAME"  kind=tensor   payload=Tensor
  "s:NAME"  kind=stage    payload=Stage       (tile tasks over loops; body of stores; transport sm or dma)
  "b:I"     kind=barrier  payload=Barrier     (a global cross-rank barrier)
  "f:NAME"  kind=flag     payload=Flag        (per-tile ready counters replacing a barrier)
Edges:
  tensor -> stage  kind=read      ;  stage -> tensor  kind=write
  stage/barrier -> stage/barrier  kind=order (program order)
  stage -> flag  kind=release     ;  flag -> stage  kind=wait, waits=(Wait, ...)
Graph-level state: one typed GraphState at g.graph["state"] (state_of reads it, update_state replaces fields): the
program, the node order, how ranks are ordered (sync), the folds, the kernels and the passes run so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import networkx as nx

from tilec.errors import Loc
from tilec.ir.types import Access, Load, Store, Var, trips, walk


@dataclass(frozen=True)
class Pull:
    """A read of buffer `via.tensor` rewritten by fuse-comm(pull) into a read of the copy's source.

    `read` is what the consumer read (a tile of the buffer); `write`/`source` are the copy stage's write and read
    accesses, whose variables `producer` are solved per element from the buffer index."""

    read: Access
    write: Access
    source: Access
    producer: tuple[Var, ...]
    dtype: str
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class InPlace(Pull):
    """A read of buffer `read.tensor` (on this rank) that local-in-place rewrote: the elements whose copy task was
    local (the copy's source rank, solved per element, is the rank holding the buffer) are read from the source in
    place; the others from the buffer, which the copy stage still fills from the peers (it skips its local tasks)."""


@dataclass(frozen=True)
class Stage:
    name: str
    loops: tuple[Var, ...]
    body: tuple[Store, ...]
    loc: Loc = field(compare=False, repr=False)
    note: str = ""  # what a pass did to it, printed by the IR printer
    # who moves a copy stage's tiles: "sm" (tasks of a kernel) or "dma" (the copy engines, passes/transport.py;
    # the stage is in no kernel and the module's DMA_COPIES table says what to copy)
    transport: str = "sm"
    # pairs of rank variables (loop vars or ME): the tasks where the two are equal are not run (local-in-place
    # drops a copy's tasks from a rank to itself)
    skip_equal: tuple[tuple[str, str], ...] = ()

    def tasks(self, world: int) -> int:
        """The tasks the stage runs: its loops' trips, less those a skip pair drops (one of W values)."""
        n = trips(self.loops)
        return n * (world - 1) // world if self.skip_equal else n

    def reads(self) -> list[Load | Pull]:
        out, seen = [], set()
        for st in self.body:
            if id(st.value) in seen:  # several stores of one tile function's results
                continue
            seen.add(id(st.value))
            out += [x for x in walk(st.value) if isinstance(x, Load | Pull)]
        return out


@dataclass(frozen=True)
class Barrier:
    index: int
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Flag:
    """Ready counters for the tiles that `producer` writes into `tensor`. One counter per value of the `key` vars
    (the producer's loop vars that index the written tile); each counter is bumped `count` times per call, on the
    rank whose copy was written (`owner`: a producer rank var, or ME). Consumers wait for epoch * count.

    `also`: the producer's other stores whose tiles the same bump counts ((write, key) each, see
    replace-barriers): every producer task maps them to the same counter as `write`, so one release after all of
    a task's stores readies them all. `member(tensor)` is the flag as seen by a reader of one of them."""

    name: str
    tensor: str
    producer: str
    write: Access
    key: tuple[str, ...]
    size: int
    count: int
    granularity: str
    loc: Loc = field(compare=False, repr=False)
    also: tuple[tuple[Access, tuple[str, ...]], ...] = ()

    @property
    def tensors(self) -> tuple[str, ...]:
        return (self.tensor, *(a.tensor for a, _ in self.also))

    def member(self, tensor: str) -> Flag:
        """This flag's counters as defined by its store into `tensor` (same counters, that tensor's tiles)."""
        if tensor == self.tensor:
            return self
        a, key = next((a, k) for a, k in self.also if a.tensor == tensor)
        return replace(self, tensor=tensor, write=a, key=key, also=())


@dataclass(frozen=True)
class Wait:
    flag: str
    read: Access  # the consumer's read of the flagged tensor (local or on a peer)
    producer: str  # the stage that releases the flag
    tensor: str  # the flagged tensor (the one `read` reads)
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Kernel:
    """One launch: stages whose tasks run in this order inside a persistent loop when `persistent`."""

    name: str
    stages: tuple[str, ...]
    persistent: bool
    concurrent: bool  # launched on its own stream, overlapping the other kernels of its phase
    barrier_before: bool  # a global barrier precedes this launch
    groups: tuple[float, ...] = ()  # workgroup specialization: each stage's share of the programs (in per mille)


@dataclass(frozen=True)
class Fold:
    """Stage `consumer` runs inside stage `producer` (fold-last): each producer task bumps its counter of `flag`
    (one per group of producer tasks, acq_rel), and the task whose bump completes the group runs, right there,
    every consumer task whose waits are on that counter. The consumer's waits on `flag` are then satisfied by
    construction and not emitted; its tasks leave the persistent loop."""

    consumer: str
    producer: str
    flag: str
    loc: Loc = field(compare=False, repr=False)


BARRIERS, FLAGS = "barriers", "flags"  # GraphState.sync
SM, DMA = "sm", "dma"  # Stage.transport


def dma_stages(g: nx.DiGraph) -> list[Stage]:
    """The stages the copy engines run (in no kernel)."""
    return [s for s in stages(g) if s.transport == DMA]


def sync(g: nx.DiGraph) -> str:
    """BARRIERS or FLAGS: what orders a stage after the stages it reads from on other ranks."""
    return state_of(g).sync


# -- the graph's own state, one accessor each: the modules above read these, not the graph's keys ---------------
class Program(Protocol):
    """What the graph keeps of the checked program it was lowered from (frontend.sema.BoundProgram)."""

    name: str
    file: str
    source: str
    world: int
    tensors: tuple
    dims: tuple
    tiles: tuple
    items: tuple


@dataclass(frozen=True)
class GraphState:
    """What the graph holds beside its nodes, one typed object (g.graph["state"]): passes replace fields, never
    mutate them.

    program: the checked program the graph was lowered from (None in a hand-made graph without one);
    order: the stage and barrier node ids in program order;
    sync: BARRIERS (global barriers between phases, as written) or FLAGS (per-tile ready counters only, once
      replace-barriers ran);
    folds: the Folds fold-last made; kernels: the Kernels persist grouped the stages into (None before persist);
    passes: each pass that made the graph, as its describe() says, in order."""

    program: Program | None = None
    order: tuple[str, ...] = ()
    sync: str = BARRIERS
    folds: tuple[Fold, ...] = ()
    kernels: tuple[Kernel, ...] | None = None
    passes: tuple[str, ...] = ()


def state_of(g: nx.DiGraph) -> GraphState:
    """The graph's state (a default one for a graph made without any)."""
    return g.graph.get("state") or GraphState()


def update_state(g: nx.DiGraph, **changes) -> None:
    """Replace fields of the graph's state (GraphState's field names)."""
    g.graph["state"] = replace(state_of(g), **changes)


def new_graph(program: Program | None = None) -> nx.DiGraph:
    """An empty graph of `program`, in sync BARRIERS, no pass run."""
    return nx.DiGraph(state=GraphState(program=program))


def program_of(g: nx.DiGraph) -> Program:
    """The checked program the graph was lowered from (None in a hand-made graph without one)."""
    return state_of(g).program


def node_order(g: nx.DiGraph) -> tuple[str, ...]:
    """The stage and barrier nodes in program order."""
    return tuple(state_of(g).order or ())


def kernels_of(g: nx.DiGraph) -> tuple[Kernel, ...]:
    """The kernels persist grouped the stages into (none before persist: see persisted)."""
    return tuple(state_of(g).kernels or ())


def persisted(g: nx.DiGraph) -> bool:
    """Whether persist has run (the graph has its kernels, if none)."""
    return state_of(g).kernels is not None


def passes_run(g: nx.DiGraph) -> tuple[str, ...]:
    """The passes that made the graph, each as its describe() says, in order."""
    return tuple(state_of(g).passes)


def payload_of(g: nx.DiGraph, n: str):
    """The payload of node n: a Stage, Tensor, Flag or Barrier (see kind_of)."""
    return g.nodes[n]["payload"]


def set_payload(g: nx.DiGraph, n: str, payload) -> None:
    """Replace node n's payload (payloads are frozen: a pass makes a new one with dataclasses.replace)."""
    g.nodes[n]["payload"] = payload


def kind_of(g: nx.DiGraph, n: str) -> str:
    """What node n is: "stage", "tensor", "flag" or "barrier"."""
    return g.nodes[n]["kind"]


def sid(name: str) -> str:
    return f"s:{name}"


def tid(name: str) -> str:
    return f"t:{name}"


def stages(g: nx.DiGraph) -> list[Stage]:
    return [payload_of(g, n) for n in node_order(g) if kind_of(g, n) == "stage"]


def stage(g: nx.DiGraph, name: str) -> Stage:
    return payload_of(g, sid(name))


def tensors(g: nx.DiGraph):
    return [payload_of(g, n) for n in g if kind_of(g, n) == "tensor"]


def tensor(g: nx.DiGraph, name: str):
    return payload_of(g, tid(name))


def flags(g: nx.DiGraph) -> list[Flag]:
    return sorted((payload_of(g, n) for n in g if kind_of(g, n) == "flag"), key=lambda f: f.name)


def waits(g: nx.DiGraph, stage_name: str) -> list[Wait]:
    out = []
    for _f, _, d in g.in_edges(sid(stage_name), data=True):
        if d["kind"] == "wait":
            out += d["waits"]
    return out


def folds(g: nx.DiGraph) -> tuple[Fold, ...]:
    return tuple(state_of(g).folds)


def barriers(g: nx.DiGraph) -> list[str]:
    return [n for n in node_order(g) if kind_of(g, n) == "barrier"]


def phases(g: nx.DiGraph) -> list[list[Stage]]:
    """Stages grouped by the barriers that separate them."""
    out: list[list[Stage]] = [[]]
    for n in node_order(g):
        if kind_of(g, n) == "barrier":
            out.append([])
        else:
            out[-1].append(payload_of(g, n))
    return [p for p in out if p]


def rebuild_edges(g: nx.DiGraph) -> None:
    """Recompute read/write/order edges from the stage payloads and the program order (flags are kept)."""
    for u, v, d in list(g.edges(data=True)):
        if d["kind"] in ("read", "write", "order"):
            g.remove_edge(u, v)
    order = node_order(g)
    for a, b in zip(order, order[1:], strict=False):
        g.add_edge(a, b, kind="order")
    for n in order:
        if kind_of(g, n) != "stage":
            continue
        st: Stage = payload_of(g, n)
        for s in st.body:
            g.add_edge(n, tid(s.access.tensor), kind="write")
        for r in st.reads():
            t = r.source.tensor if isinstance(r, Pull) else r.access.tensor  # a pulled buffer no longer exists
            g.add_edge(tid(t), n, kind="read")
            if isinstance(r, InPlace):  # reads the buffer too (the rows the peers copied in)
                g.add_edge(tid(r.read.tensor), n, kind="read")


def copy_graph(g: nx.DiGraph) -> nx.DiGraph:
    h = g.copy()
    h.graph = dict(g.graph)
    return h
