"""The verifier, run after every pass: it decides, exactly, that the graph computes what the program says on every
rank, or rejects it (VerifyError) with located diagnostics (`file:line:col: error: ...`, the source line, a caret).

Dims are compile-time constants, so every access is a known set of elements on known ranks (ir/regions.py:
enumerated per component of variables, not per task or element). One module per rule family, run in this order
(each module's docstring says what it proves):
  structure  nodes, payloads, names, program order, accesses well formed, kernels name known stages
  accesses   variables in scope, tile extents, in bounds, peers only of symmetric tensors, no stores into inputs
  rows       data-dependent rows: index and count elements in bounds, gathered dims span their whole dim
  barriers   the sync mode; no barrier left under flags
  kernels    every stage in exactly one kernel, in program order, global barriers only between kernels
  transport  a dma stage copies tiles whose sources no stage writes, in a graph ordered by flags
  nodes      peers off a rank's node are never reached by pointer (no dma stage across nodes)
  writes     no two tasks store one element of one rank's copy in one phase; outputs written where the program does
  reads      every element read is written earlier and ordered before the read; no later store races it
  flags      counters solvable per element, each released exactly `count` times per call
  waits      every wait emitted, covering every producer tile read, on counters that complete
  folds      a folded consumer runs once per task, in the group its waits name
  deadlock   waits only on earlier stages that can run; no wait cycle
A problem is either proven ("race: ...", "write conflict: ...", "missing release: ...") or a question the
verifier cannot decide within its limits, which it refuses, never trusts: "cannot prove ...; rewrite as ...".
"""

from __future__ import annotations

import networkx as nx

from tilec.errors import NOWHERE, Diagnostic, VerifyError
from tilec.ir.graph import program_of

from . import (
    accesses,
    barriers,
    deadlock,
    flags,
    folds,
    kernels,
    nodes,
    reads,
    rows,
    structure,
    transport,
    waits,
    writes,
)
from .context import Ctx, Stop, reads_of
from .folds import fold_problem

__all__ = ["RULES", "fold_problem", "reads_of", "verify"]

# (name, check): the order matters; the rules after `accesses` assume accesses in scope and in bounds
RULES = [("accesses", accesses.check), ("rows", rows.check), ("barriers", barriers.check), ("kernels", kernels.check),
         ("transport", transport.check), ("nodes", nodes.check), ("writes", writes.check), ("reads", reads.check),
         ("flags", flags.check), ("waits", waits.check), ("folds", folds.check), ("deadlock", deadlock.check)]


def verify(g: nx.DiGraph, after: str = "?") -> None:
    """Raise VerifyError (every problem found, each located) unless graph g, as left by pass `after`, is sound."""
    prog = program_of(g)
    if prog is None:
        raise VerifyError(after, [Diagnostic(NOWHERE, "the graph has no program", "structure")])
    ctx = Ctx(g)
    try:
        ctx.rule = "structure"
        structure.check(ctx)
        if not ctx.problems:
            for name, rule in RULES:
                ctx.rule = name
                rule(ctx)
                if ctx.problems and name in ("accesses", "rows"):
                    break
    except Stop as e:
        ctx.problems.append(e.diagnostic)
    if ctx.problems:
        raise VerifyError(after, ctx.problems, getattr(prog, "source", None))
