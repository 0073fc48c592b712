"""Tensors with several writers whose elements are disjoint (the steps of a ring, frontend/steps.py), for
replace-barriers: each read of one waits on the one writer whose elements it reaches.

`ring_writers(g)` maps such a tensor to its writer stages (every pair of their stores proven disjoint, exactly:
ir/regions.py); `reads_from` names the one writer a consumer's read reaches, or refuses (ScheduleError) a read that
reaches several writers' elements, as one flag orders one producer.
"""

from __future__ import annotations

import itertools

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir import regions
from tilec.ir.graph import program_of, stages
from tilec.ir.types import ME, Access, Var, reduction_vars


def _dom(s, world: int, reads: bool = False) -> dict[str, Var]:
    out = {v.name: v for v in s.loops} | {ME: Var(ME, "me", world, 1, s.loc)}
    return out | ({v.name: v for x in s.body for v in reduction_vars(x.value)} if reads else {})


def ring_writers(g: nx.DiGraph) -> dict[str, list]:
    prog = program_of(g)
    by: dict[str, list] = {}
    for s in stages(g):
        for st in s.body:
            by.setdefault(st.access.tensor, []).append((s, st))
    out = {}
    for t, ws in by.items():
        if len({s.name for s, _ in ws}) < 2:
            continue
        shape = prog.tensor(t).shape
        try:
            rs = [regions.region(st.access, _dom(s, prog.world), prog.world, shape, skip=s.skip_equal) for s, st in ws]
            if all(regions.common(a, b) is None for a, b in itertools.combinations(rs, 2)):
                out[t] = [(s, st, r) for (s, st), r in zip(ws, rs, strict=True)]
        except regions.Undecidable:
            continue
    return out


def reads_from(g: nx.DiGraph, writers: list, c, read: Access) -> str | None:
    """The writer stage whose elements consumer `c`'s `read` reaches (None: none does)."""
    prog = program_of(g)
    want = regions.region(read, _dom(c, prog.world, reads=True), prog.world, prog.tensor(read.tensor).shape)
    hit = list(dict.fromkeys(s.name for s, _st, r in writers if regions.common(want, r) is not None))
    if len(hit) > 1:
        raise ScheduleError(f"replace-barriers: stage '{c.name}' ({read.loc}) reads {read}, which reaches the elements"
                            " of stages"
                            f" '{hit[0]}' and '{hit[1]}'; a flag orders one producer: rewrite the read as one per"
                            " writer")
    return hit[0] if hit else None
