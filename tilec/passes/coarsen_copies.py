"""coarsen-copies: fewer, larger tasks for a copy stage that only moves tiles to its peers.

A copy of BM x BK tiles makes one task per tile: 36864 tasks of 16 KiB for an 8192 x 36864 bf16 gather, each
decoding its tile, computing a peer offset and releasing a counter with a system-scope fence. Where the copy's
innermost tile loop indexes no counter of its flags (its readers wait for whole rows of tiles: granularity auto),
that loop takes `c` of its steps at once (c a power of two, a task moving at most COPY_BYTES), and each counter is
bumped c times fewer.

  Before:  stage gather over r != rank, m in 4096 by 128, k in 36864 by 64:  Ag@r[m + 4096*rank, k] = A[m, k]
           flag Ag.gather [m, rank] +576 per call
  After:   stage gather over r != rank, m in 4096 by 128, k in 36864 by 256: Ag@r[m + 4096*rank, k] = A[m, k]
           flag Ag.gather [m, rank] +144 per call

Runs after local-in-place (fused-push), on the copy stages it left copying only between peers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from tilec.ir.dtypes import ESIZE
from tilec.ir.gather import counted_loop
from tilec.ir.graph import SM, InPlace, Stage, flags, payload_of, set_payload, sid, stages, tid
from tilec.ir.types import Access, map_expr

from .base import Pass

COPY_BYTES = 64 << 10  # bytes one copy task moves at most (a 128 x 256 bf16 tile: 64 KiB of registers per program)


@dataclass(frozen=True)
class CoarsenCopies(Pass):
    name = "coarsen-copies"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        for cp in stages(g):
            if not cp.skip_equal or len(cp.body) != 1 or cp.transport != SM:
                continue  # (the copy engines merge a chunk's tiles into few large copies themselves)
            c, v = _factor(g, cp)
            if c == 1:
                continue
            wide = replace(v, step=v.step * c)
            st = cp.body[0]
            body = (replace(st, access=_widen(st.access, v.name, c), value=replace(
                st.value, access=_widen(st.value.access, v.name, c),
                shape=tuple(n * c if tv == v.name else n for n, tv in zip(st.value.shape, st.value.access.tile,
                                                                         strict=True)))),)
            loops = tuple(wide if x.name == v.name else x for x in cp.loops)
            set_payload(g, sid(cp.name), replace(cp, loops=loops, body=body,
                                                       note=f"{cp.note}; {c} tiles of {v.name} per task"))
            def fix(e, old=st, new=body[0], loops=loops):  # in-place reads name the copy they read through
                if isinstance(e, InPlace) and e.write == old.access and e.source == old.value.access:
                    return replace(e, write=new.access, source=new.value.access, producer=loops)
                return e

            for c2 in stages(g):
                new_body = tuple(replace(x, value=map_expr(x.value, fix)) for x in c2.body)
                if new_body != c2.body:
                    set_payload(g, sid(c2.name), replace(c2, body=new_body))
            for f in flags(g):
                if f.producer == cp.name:
                    set_payload(g, f"f:{f.name}", replace(f, write=body[0].access,
                                                                count=f.count // v.trips * wide.trips))
        return g


def _factor(g: nx.DiGraph, cp: Stage):
    """(c, the loop): how many steps of the copy's innermost tile loop one task takes (1: leave it)."""
    st = cp.body[0]
    v = cp.loops[-1]
    if v.is_rank or v.trips < 2 or any(v.name in f.key for f in flags(g) if f.producer == cp.name):
        return 1, v
    if counted_loop(cp.loops) is not None:  # a wider step would read one block's count for several blocks
        return 1, v
    a, b = st.access, st.value.access
    if v.name not in a.tile or v.name not in b.tile or any(v.name in x.vars and v.name not in x.tile
                                                            for x in (a, b)):
        return 1, v
    if any(aff.coef(v.name) not in (0, 1) for x in (a, b) for aff in x.index):
        return 1, v
    tile_bytes = ESIZE[payload_of(g, tid(a.tensor)).dtype]
    for n in a.shape:
        tile_bytes *= n
    c = 1
    while c * 2 <= v.trips and tile_bytes * c * 2 <= COPY_BYTES:
        c *= 2
    return c, v


def _widen(a: Access, var: str, c: int) -> Access:
    return replace(a, shape=tuple(n * c if tv == var else n for n, tv in zip(a.shape, a.tile, strict=True)))
