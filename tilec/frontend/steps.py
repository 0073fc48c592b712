"""Ring forwarding: a stage that reads what it writes runs step by step over its first loop.

    stage ring over s in W - 1 by 1, m in M/W by BM, k in K by BK:
      Ag[((rank - s - 1) % W) * M/W + m, k] = Ag@(rank - 1)[((rank - s - 1) % W) * M/W + m, k]

Step s reads the chunk its left neighbour received at step s - 1. Such a stage, whose first loop is a rank loop or
a unit-step tile loop (its steps), becomes one stage per step, `ring_0`, `ring_1`, ..., with that loop's variable
a constant in each and a `barrier` between consecutive ones: every check of sema and every pass then applies as
to stages written out by hand (flags turn the barriers into one neighbour's per-tile flags; bsp keeps them).
A stage of zero steps (`s in W - 1 by 1` at a world of one) is no stage at all. A stage over steps reading what a
forwarding stage wrote (`gemm over s in ranks, ...` reading the chunk that arrived at step s) runs step by step as
well, so each step's reads wait on one step of the ring.
"""

from __future__ import annotations

import dataclasses

from tilec.frontend import ast
from tilec.frontend.affine import NotAffine, affine


def _refs(e):
    if isinstance(e, ast.Ref):
        yield e
    if dataclasses.is_dataclass(e):
        for f in dataclasses.fields(e):
            x = getattr(e, f.name)
            for y in x if isinstance(x, tuple) else (x,):
                if dataclasses.is_dataclass(y):
                    yield from _refs(y)


def _subst(e, var: str, value: int):
    """e with every use of the name `var` replaced by the integer `value`."""
    if isinstance(e, ast.Name) and e.id == var:
        return ast.Int(value, e.loc)
    if not dataclasses.is_dataclass(e):
        return e
    changes = {}
    for f in dataclasses.fields(e):
        x = getattr(e, f.name)
        if isinstance(x, tuple):
            changes[f.name] = tuple(_subst(y, var, value) for y in x)
        elif dataclasses.is_dataclass(x):
            changes[f.name] = _subst(x, var, value)
    return dataclasses.replace(e, **changes)


def forwards(st: ast.Stage) -> bool:
    """Whether the stage reads a tensor it writes."""
    written = {t.tensor for a in st.body for t in a.targets if t is not None}
    return any(r.tensor in written for a in st.body for r in _refs(a.value))


def ring_steps(st: ast.Stage, consts: dict[str, int], world: int,
               stepped: set[str] = frozenset()) -> list[ast.Stage | ast.Barrier] | None:
    """The stage's steps with barriers between them, or None when it is not a forwarding stage over steps (sema
    then says why it may not read what it writes). A stage over steps that reads a tensor an earlier forwarding
    stage wrote (`stepped`: a GEMM over the chunks a ring gathers) runs step by step too, without barriers: each
    step reads the chunk of one step of the ring. NotAffine where its step count is not a constant."""
    fwd = forwards(st)
    reads = {r.tensor for a in st.body for r in _refs(a.value)}
    if not (fwd or reads & stepped) or not st.loops:
        return None
    lp = st.loops[0]
    if lp.kind == "rank":
        n = world
    else:
        _, step = affine(lp.step, consts)
        if step != 1:
            return None
        terms, n = affine(lp.extent, consts)
        if terms or int(n) != n or n < 0:
            raise NotAffine(lp.loc, f"ring steps '{lp.var}' of stage '{st.name}': the step count must be a whole"
                                    f" number >= 0, got {n}")
        n = int(n)
    out: list[ast.Stage | ast.Barrier] = []
    for i in range(n):
        if i and fwd:
            out.append(ast.Barrier(st.loc))
        body = tuple(_subst(a, lp.var, i) for a in st.body)
        out.append(ast.Stage(f"{st.name}_{i}", st.loops[1:], body, st.loc))
    return out
