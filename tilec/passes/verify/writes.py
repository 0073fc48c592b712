"""Rule writes: no two tasks (of any stages, on any ranks, pushes included) store one element of one rank's
copy in one phase (between barriers; at all once flags replace them), so several writers of a tensor read under
flags (a ring's steps) write disjoint elements; every element the program as written stores into an
output is still stored.
"""

from __future__ import annotations

import itertools

from tilec.ir import regions
from tilec.ir.gather import Gathered
from tilec.ir.graph import Stage, program_of

from .context import Ctx, decide, stores_of


def check(ctx: Ctx) -> None:
    by_tensor = stores_of(ctx)
    for t, ws in by_tensor.items():
        for s, st, r in ws:
            if isinstance(st.access, Gathered):  # a scatter: its tasks' rows are distinct by a run-time check (rows)
                continue
            hit = decide(ctx, st.loc, f"stage '{s.name}' writes {st.access}", regions.self_overlap, r)
            if hit:
                why, p = hit
                ctx.err(st.loc, f"write conflict: tasks of stage '{s.name}' store {st.access} into the same element"
                                f" {ctx.element(t, p)} ({why})")
        # several writers of a tensor read under flags (a ring's steps): their elements are disjoint (below), and
        # rule reads checks that every read reaches the elements of one writer, whose flag it waits on
        for (s1, st1, r1), (s2, st2, r2) in itertools.combinations(ws, 2):
            if not ctx.flagged and ctx.phase[s1.name] != ctx.phase[s2.name]:
                continue
            p = decide(ctx, st2.loc, f"stage '{s2.name}' writes {st2.access}", regions.common, r1, r2)
            if p:
                who = f"stage '{s1.name}' stores" if s1 is s2 else f"stages '{s1.name}' and '{s2.name}' store"
                ctx.err(st2.loc, f"write conflict: {who} {ctx.element(t, p)} ({st1.access} and {st2.access}) with"
                                 " no barrier between them")
    # a program may leave parts of an output alone (they keep what the caller put there); a pass may not: every
    # element the program as written stores must still be stored
    written = {}
    for it in program_of(ctx.g).items:
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
            hole = decide(ctx, t.loc, f"output '{t.name}'", regions.uncovered, [r for _, _, r in ws], want)
            if hole:
                ctx.err(t.loc, f"output '{t.name}' is not written everywhere the program writes it: no stage stores"
                               f" {ctx.element(t.name, hole)}")
                break
