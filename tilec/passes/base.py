"""Pass infrastructure: a pass is a named, frozen unit `graph -> new graph`; the driver verifies after each one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import networkx as nx

from tilec.ir.graph import copy_graph, passes_run, update_state


@dataclass(frozen=True)
class Pass:
    """Subclasses set `name` and implement `apply` on a private copy of the graph."""

    name = "pass"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, g: nx.DiGraph) -> nx.DiGraph:
        h = self.apply(copy_graph(g))
        update_state(h, passes=(*passes_run(g), self.describe()))
        return h

    def describe(self) -> str:
        opts = ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"{self.name}({opts})" if opts else self.name


def run_pipeline(g: nx.DiGraph, passes: list[Pass], verify: Callable[[nx.DiGraph, str], None],
                 snapshots: dict[str, nx.DiGraph] | None = None) -> nx.DiGraph:
    for p in passes:
        g = p(g)
        verify(g, p.name)
        if snapshots is not None:
            snapshots[p.name] = g
    return g
