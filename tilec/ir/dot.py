"""The tile dataflow graph as a Graphviz DOT picture (`tilec show --format dot|svg|png`, CompiledProgram.draw).

What is drawn (counts are exact; tests/test_pictures.py checks them against the graph):
  nodes  one per tensor, barrier and flag; per stage, one per tile group (`tile_groups`: one task per node until a
         stage has more than LIMIT tasks, then whole loops are collapsed into counted groups, innermost tile loop
         first, rank loops last, so the rank axis stays visible)
  edges  per tile group, one per (tensor, mode) it reads and one per (tensor, mode) it writes (mode: local, peer
         (`X@r`, labelled with the rank), pull (fused-pull's read of the copy's source)); one per program-order
         step (labelled `barrier` next to one); one per flag release and one per flag wait (stage to flag, flag to
         stage)
  clusters  a stage each, inside a cluster per kernel once `persist` ran (persistent, stream, barrier before).
The DOT text is written here (no dependency); `render` turns it into svg/png with graphviz when it is installed.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from tilec.errors import TilecError
from tilec.fileio import write_atomic  # whole file or nothing; callers import it from here too
from tilec.ir.graph import Pull, Stage, kernels_of, kind_of, node_order, payload_of, program_of
from tilec.ir.types import ME, Var, trips

LIMIT = 8  # tile-group nodes per stage before loops are collapsed: readable at the examples' default sizes
FORMATS = ("dot", "svg", "png")


class RenderUnavailable(TilecError):
    """svg/png asked for, but graphviz's `dot` is not installed; the message says how to render the DOT text. A
    missing optional tool means the request could not be carried out: exit code 2, as TilecError's (1 is a wrong
    result)."""


@dataclass(frozen=True)
class TileGroup:
    """Tasks of a stage that share the values of the kept loops (`values`: var -> index); `count` tasks each."""

    stage: str
    values: tuple[tuple[Var, int], ...]
    collapsed: tuple[Var, ...]
    count: int

    @property
    def node(self) -> str:
        return f"g:{self.stage}:" + ",".join(f"{v.name}={i}" for v, i in self.values)

    def value(self, var: str) -> int | None:
        return next((i for v, i in self.values if v.name == var), None)

    def label(self) -> str:
        kept = " ".join(f"{v.name}={i if v.is_rank else i * v.step}" for v, i in self.values) or "all"
        if self.count == 1:
            return kept
        return f"{kept}\n{self.count} tasks over {', '.join(v.name for v in self.collapsed)}"


def visible_loops(st: Stage) -> list[Var]:
    """The loops that make more than one task (one-trip loops and `:` slices add nothing to a picture)."""
    return [v for v in st.loops if v.trips > 1]


def tile_groups(st: Stage, limit: int = LIMIT) -> list[TileGroup]:
    loops = visible_loops(st)
    order = [v for v in reversed(loops) if not v.is_rank] + [v for v in reversed(loops) if v.is_rank]
    kept = list(loops)
    for v in order:
        if trips(kept) <= limit:
            break
        kept.remove(v)
    collapsed = tuple(v for v in loops if v not in kept)
    count = trips(collapsed)
    return [TileGroup(st.name, tuple(zip(kept, idx, strict=True)), collapsed, count)
            for idx in itertools.product(*(range(v.trips) for v in kept))]


def _q(s: str) -> str:
    """A DOT quoted string (newlines become DOT line breaks)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**kw) -> str:
    return "[" + ", ".join(f"{k}={_q(str(v))}" for k, v in kw.items() if v is not None) + "]"


def accesses(st: Stage) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(reads, writes) of a stage as distinct (tensor, mode, rank var) with mode local | peer | pull."""
    reads: dict[tuple[str, str], str] = {}
    for r in st.reads():
        if isinstance(r, Pull):
            a = r.source
            reads.setdefault((a.tensor, "pull"), r.read.rank if r.read.remote else a.rank)
        else:
            a = r.access
            reads.setdefault((a.tensor, "peer" if a.remote else "local"), a.rank)
    writes: dict[tuple[str, str], str] = {}
    for s in st.body:
        writes.setdefault((s.access.tensor, "peer" if s.access.remote else "local"), s.access.rank)
    return [(t, m, r) for (t, m), r in reads.items()], [(t, m, r) for (t, m), r in writes.items()]


def _mode_label(mode: str, rank: str, group: TileGroup, write: bool) -> str | None:
    if mode == "local":
        return None
    at = group.value(rank) if rank != ME else None
    who = f"rank {at}" if at is not None else f"rank {rank}" if rank != ME else "peers"
    if mode == "pull":
        return f"pull from {who}"
    return f"peer: to {who}" if write else f"peer: from {who}"


def to_dot(g: nx.DiGraph, title: str = "", limit: int = LIMIT) -> str:
    prog = program_of(g)
    head = f"{prog.name}  world={prog.world}  " + " ".join(f"{k}={v}" for k, v in (*prog.dims, *prog.tiles))
    label = f"{title}\n{head}" if title else head
    graph = _attrs(label=label, labelloc="t", rankdir="LR", compound="true", fontname="Helvetica", fontsize="11",
                   nodesep="0.15", ranksep="0.6")
    out = [f"digraph {_q(prog.name)} {{", f"  graph {graph};",
           "  node [fontname=\"Helvetica\", fontsize=\"9\"];",
           "  edge [fontname=\"Helvetica\", fontsize=\"8\"];"]
    for n in sorted(g):
        kind = kind_of(g, n)
        if kind == "tensor":
            t = payload_of(g, n)
            sym = " symmetric" if t.symmetric else ""
            shape = ", ".join(map(str, t.shape))
            a = _attrs(label=f"{t.kind} {t.name}\n{t.dtype}[{shape}]{sym}", style="filled",
                       shape="cylinder" if t.kind == "buf" else "box",
                       fillcolor="#eeeeee" if t.kind == "buf" else "#dde8f4")
            out.append(f"  {_q(n)} {a};")
        elif kind == "flag":
            f = payload_of(g, n)
            key = ", ".join(f.key) or "-"
            a = _attrs(label=f"flag {f.name}\n{f.size} counter(s) [{key}]\n+{f.count} per call", shape="diamond",
                       style="filled", fillcolor="#fde6b0")
            out.append(f"  {_q(n)} {a};")
        elif kind == "barrier":
            a = _attrs(label="barrier", shape="box", style="filled,bold", fillcolor="#f4b6b6")
            out.append(f"  {_q(n)} {a};")
    groups: dict[str, list[TileGroup]] = {}
    stage_nodes = [n for n in node_order(g) if kind_of(g, n) == "stage"]
    for n in stage_nodes:
        groups[n] = tile_groups(payload_of(g, n), limit)
    kernels = kernels_of(g)
    in_kernel = {s for k in kernels for s in k.stages}
    for i, k in enumerate(kernels):
        attrs = ["persistent" if k.persistent else "one program per task",
                 f"stream {i if k.concurrent else 0}" + (" (concurrent)" if k.concurrent else "")]
        if k.barrier_before:
            attrs.append("after a barrier")
        if k.groups:
            attrs.append("programs per stage " + ":".join(f"{x:g}" for x in k.groups))
        out.append(f"  subgraph {_q('cluster_kernel_' + k.name)} {{")
        a = _attrs(label=f"kernel {k.name}\n" + ", ".join(attrs), style="dashed", color="#555555")
        out.append(f"    graph {a};")
        for s in k.stages:
            out += _stage_cluster(g, f"s:{s}", groups[f"s:{s}"], "    ")
        out.append("  }")
    for n in stage_nodes:
        if payload_of(g, n).name not in in_kernel:
            out += _stage_cluster(g, n, groups[n], "  ")
    out += _edges(g, groups)
    out.append("}")
    return "\n".join(out) + "\n"


def _stage_cluster(g: nx.DiGraph, n: str, gs: list[TileGroup], ind: str) -> list[str]:
    st: Stage = payload_of(g, n)
    loops = ", ".join(f"{v.name} in ranks" if v.is_rank else f"{v.name} in {v.extent} by {v.step}"
                      for v in visible_loops(st)) or "one task"
    tasks = trips(visible_loops(st))
    note = f"\n{st.note}" if st.note else ""
    a = _attrs(label=f"stage {st.name}: {tasks} task(s)\nover {loops}{note}", style="rounded,filled",
               fillcolor="#f6f6f6", color="#888888")
    out = [f"{ind}subgraph {_q('cluster_' + n)} {{", f"{ind}  graph {a};"]
    for grp in gs:
        a = _attrs(label=grp.label(), shape="box", style="rounded,filled",
                   fillcolor="#ffffff" if grp.count == 1 else "#e4f2e4")
        out.append(f"{ind}  {_q(grp.node)} {a};")
    out.append(f"{ind}}}")
    return out


def _edges(g: nx.DiGraph, groups: dict[str, list[TileGroup]]) -> list[str]:
    out = []

    def anchor(n: str) -> tuple[str, dict]:  # a stage's end of a stage-level edge: its first group, clipped
        return (groups[n][0].node, {"cluster": f"cluster_{n}"}) if n in groups else (n, {})

    def edge(u: str, v: str, **kw) -> None:
        (a, ua), (b, va) = anchor(u), anchor(v)
        kw.setdefault("ltail", ua.get("cluster"))
        kw.setdefault("lhead", va.get("cluster"))
        out.append(f"  {_q(a)} -> {_q(b)} {_attrs(**kw)};")

    for n, gs in groups.items():
        reads, writes = accesses(payload_of(g, n))
        for grp in gs:
            for t, mode, rank in reads:
                label = _mode_label(mode, rank, grp, False)
                out.append(f"  {_q('t:' + t)} -> {_q(grp.node)} {_attrs(label=label, color=_COLOR[mode])};")
            for t, mode, rank in writes:
                label = _mode_label(mode, rank, grp, True)
                out.append(f"  {_q(grp.node)} -> {_q('t:' + t)} {_attrs(label=label, color=_COLOR[mode])};")
    order = node_order(g)
    for a, b in zip(order, order[1:], strict=False):
        near_barrier = "barrier" in (kind_of(g, a), kind_of(g, b))
        edge(a, b, label="barrier" if near_barrier else "program order", style="bold" if near_barrier else "dotted",
             color="#c03030" if near_barrier else "#999999")
    for u, v, d in sorted(g.edges(data=True), key=lambda e: (e[0], e[1])):
        if d["kind"] == "release":
            f = payload_of(g, v)
            edge(u, v, label=f"flag: release +{f.count}", color="#c08000")
        elif d["kind"] == "wait":
            edge(u, v, label=f"flag: wait ({len(d['waits'])})", color="#c08000", style="dashed")
    return out


_COLOR = {"local": "#4c72b0", "peer": "#2a9d5c", "pull": "#8a4fbf"}


# -- rendering ---------------------------------------------------------------------------------------


def renderer() -> str | None:
    """How svg/png can be made here: "graphviz" (the Python package, which runs `dot`), "dot" (the binary alone),
    or None."""
    if shutil.which("dot") is None:
        return None
    try:
        import graphviz  # noqa: F401
    except ImportError:
        return "dot"
    return "graphviz"


def render(text: str, fmt: str) -> bytes:
    """DOT text -> svg/png bytes through graphviz; RenderUnavailable when `dot` is not installed."""
    how = renderer()
    if how is None:
        raise RenderUnavailable(f"format {fmt}: graphviz's `dot` is not on PATH (apt install graphviz); "
                                f"use format dot and run `dot -T{fmt} FILE.dot -o FILE.{fmt}`")
    if how == "graphviz":
        import graphviz

        return graphviz.Source(text).pipe(format=fmt)
    done = subprocess.run(["dot", f"-T{fmt}"], input=text.encode(), capture_output=True, timeout=120)
    if done.returncode:
        raise TilecError(f"dot -T{fmt} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    return done.stdout


def check_output_path(path: str | os.PathLike, what: str = "-o") -> Path:
    """An output file's path, checked before any work: its folder exists and it is not a folder itself."""
    p = Path(path)
    try:
        if p.is_dir():
            raise TilecError(f"{what} {path}: is a directory; give a file name")
        if not p.parent.is_dir():
            raise TilecError(f"{what} {path}: folder {p.parent} does not exist")
    except OSError as e:  # a name too long, a loop of links
        raise TilecError(f"{what} {path}: cannot write here ({e.strerror})") from None
    return p


def draw(g: nx.DiGraph, fmt: str, path: str | os.PathLike | None, title: str = "") -> str | bytes:
    """The picture of g as DOT text (fmt "dot") or svg/png bytes, also written to `path` when given. Without
    graphviz, svg/png with a path write the DOT text beside it (PATH.dot) and raise RenderUnavailable saying how to
    render it."""
    if fmt not in FORMATS:
        raise TilecError(f"format {fmt!r}: choose from {', '.join(FORMATS)}")
    p = check_output_path(path, "path") if path is not None else None
    text = to_dot(g, title)
    if fmt == "dot":
        if p is not None:
            write_atomic(p, text)
        return text
    if renderer() is None and p is not None:
        dot_path = p.with_suffix(".dot")
        write_atomic(dot_path, text)
        raise RenderUnavailable(f"graphviz's `dot` is not on PATH: wrote {dot_path}; render it with "
                                f"`dot -T{fmt} {dot_path} -o {p}` (apt install graphviz)")
    data = render(text, fmt)
    if p is not None:
        write_atomic(p, data)
    return data
