"""The copy-engine plan of a module: what each rank's dma stages copy, chunk by chunk (the DMA_COPIES table).

A chunk is the tiles behind one flag counter: its copies, then one write of the call's epoch into that counter
(the stage's flags count 1 per call, passes/transport.py). Tiles are merged into boxes along every dim where
both source and destination continue, and a box becomes strided 2-D copies (`cudaMemcpy2DAsync` shape: rows of
`width` contiguous elements, `pitch` apart), so the runtime issues a few large copies, not one per tile.

    DMA_COPIES = {rank: ((flag parameter, counter, owner rank,
                          ((src, src rank, src offset, src pitch, dst, dst rank, dst offset, dst pitch, width, rows),
                           ...)), ...)}

Offsets and pitches count elements of the tensors (every tensor is contiguous). A rank's chunks come in the order
its copy engines should issue them: the tiles it already holds first, then each peer's, nearest peer first.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from tilec.errors import ScheduleError
from tilec.ir import peers, regions
from tilec.ir.graph import Flag, dma_stages, flags, program_of, tensor
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import strides
from tilec.ir.types import ME, Var

from .text import ident


def dma_table(g: nx.DiGraph) -> dict[int, list[tuple]]:
    """rank -> its chunks (see the module docstring); empty when no stage runs on the copy engines."""
    world = program_of(g).world
    out: dict[int, list[tuple]] = {}
    for q in range(world):
        chunks: dict[tuple, list] = {}
        for s in dma_stages(g):
            for st in s.body:
                for key, box in _boxes(g, s, st, store_flag(g, s.name, st.access), q):
                    chunks.setdefault(key, []).append(box)
        rows = []
        for (param, counter, owner), boxes in chunks.items():
            copies = [c for b in _merge(boxes) for c in _strided(g, b)]
            rows.append((param, counter, owner, tuple(copies)))
        # local tiles first (the consumer starts on them), then the peers nearest first (ranks do not all pull
        # from, or push to, rank 0 at once), in counter order within a peer
        rows.sort(key=lambda r: ((peer(r[3][0], q) - q) % world if r[3] else 0, r[0] or "", r[1]))
        if rows:
            out[q] = rows
    _one_chunk_per_counter(out)
    return out


def _one_chunk_per_counter(table: dict[int, list[tuple]]) -> None:
    """A chunk sets its counter to the call's epoch (it cannot add to it), so two chunks setting one counter would
    let its readers go once the first landed: refused here, whatever pass made such a plan (transport.one_sender
    gives each sending rank counters of its own)."""
    setter: dict[tuple, int] = {}
    for q, rows in table.items():
        for param, counter, owner, _copies in rows:
            if param is None:
                continue
            first = setter.setdefault((param, counter, owner), q)
            if first != q:
                raise ScheduleError(f"transport=dma: ranks {first} and {q} would both set counter {counter} of"
                                    f" {param} on rank {owner}; a copy engine sets a counter, it cannot count"
                                    " senders (use transport=sm for this stage)")


def store_flag(g: nx.DiGraph, stage: str, write) -> Flag | None:
    """The flag that readies the tiles of one store of a dma stage, as that store defines its counters: a flag
    shared by several stores (`Ag+Bg.gather`) counts each store's tiles, so they join the chunk of its counter."""
    for f in flags(g):
        if f.producer == stage and write in (f.write, *(a for a, _k in f.also)):
            return f.member(write.tensor)
    return None


def peer(copy: tuple, q: int) -> int:
    """The other rank of a copy issued by rank q: its source (pull) or else its destination (push)."""
    return copy[1] if copy[1] != q else copy[5]


def chunk_streams(rows, q: int, world: int, max_streams: int) -> list[int]:
    """The side stream of each of rank q's chunks, in order: one stream per ring distance of the chunk's peer (its
    local chunks on the stream of distance 0), numbered as they first appear, at most max_streams, so the peers'
    chunks overlap on the copy engines (runtime/dma.py issues them so; perf/taxes.py charges them so)."""
    ring: dict[int, int] = {}
    return [ring.setdefault(((peer(copies[0], q) if copies else q) - q) % world % max_streams, len(ring))
            for _param, _counter, _owner, copies in rows]


def _boxes(g: nx.DiGraph, s, st, f, q: int):
    """((flag param, counter, owner), (src, src rank, src starts, dst, dst rank, dst starts, lengths)) per task of
    stage `s` on rank q."""
    world = program_of(g).world
    dom = {v.name: v for v in s.loops}
    env = regions.grid(list(s.loops), f"the copies of stage {s.name}")
    n = peers.combinations(env)
    env[ME] = np.full(n, q, dtype=np.int64)
    dom[ME] = Var(ME, "me", world, 1, s.loc)
    env = peers.derive(env, dom)  # peers and index pieces of the rank (ir/peers.py)
    src, dst = st.value.access, st.access
    srank = env[src.rank] if src.rank != ME else env[ME]
    drank = env[dst.rank] if dst.rank != ME else env[ME]
    s_lo, d_lo, lens = [], [], []
    for d in range(len(dst.index)):
        a, _ = regions.interval(src.index[d], src.tile[d], dom, env, n)
        b, e = regions.interval(dst.index[d], dst.tile[d], dom, env, n)
        s_lo.append(a)
        d_lo.append(b)
        lens.append(e - b)
    counter, owner = np.zeros(n, dtype=np.int64), drank
    param = None
    if f is not None:
        param = f"F_{ident(f.name)}"
        dims = flag_dims(g, f)
        for dv, stride in zip(dims, strides(dims), strict=True):
            r = env[dv.rank_var] if dv.key_rank and dv.rank_var else 0
            t = env[dv.tile_var] // dv.step if dv.key_tile and dv.tile_var else 0
            counter = counter + stride * dv.lin_of(r, t)
        owner = env[f.write.rank] if f.write.rank != ME else env[ME]
    skipped = np.zeros(n, dtype=bool)  # local-in-place: a rank's copies to itself are dropped, readers read in place
    for a, b in s.skip_equal:
        skipped |= (env[a] if a != ME else env[ME]) == (env[b] if b != ME else env[ME])
    for i in range(n):
        if skipped[i] or any(int(x[i]) <= 0 for x in lens):
            continue
        yield ((param, int(counter[i]) if param else 0, int(owner[i])),
               (src.tensor, int(srank[i]), tuple(int(x[i]) for x in s_lo), dst.tensor, int(drank[i]),
                tuple(int(x[i]) for x in d_lo), tuple(int(x[i]) for x in lens)))


def _merge(boxes: list[tuple]) -> list[tuple]:
    """Join boxes that continue each other along one dim in source and destination alike, dim by dim from the
    last (rows of a tile row first), until nothing joins."""
    if not boxes:
        return boxes
    nd = len(boxes[0][2])
    changed = True
    while changed:
        changed = False
        for d in reversed(range(nd)):
            def rest(b, d=d):
                return (b[0], b[1], b[3], b[4], *(x for i, x in enumerate(b[2]) if i != d),
                        *(x for i, x in enumerate(b[5]) if i != d), *(x for i, x in enumerate(b[6]) if i != d))
            boxes = sorted(boxes, key=lambda b, d=d: (rest(b), b[2][d]))
            out = [boxes[0]]
            for b in boxes[1:]:
                a = out[-1]
                if rest(a) == rest(b) and a[2][d] + a[6][d] == b[2][d] and a[5][d] + a[6][d] == b[5][d]:
                    lens = tuple(x + (b[6][d] if i == d else 0) for i, x in enumerate(a[6]))
                    out[-1] = (*a[:6], lens)
                    changed = True
                else:
                    out.append(b)
            boxes = out
    return sorted(boxes, key=lambda b: (b[1], b[5], b[2]))


def _strided(g: nx.DiGraph, box: tuple) -> list[tuple]:
    """A box as 2-D copies: the innermost dims the box spans whole (in both tensors) make one contiguous row, the
    next dim outward gives the rows, every dim further out a copy of its own."""
    src, srank, s_lo, dst, drank, d_lo, lens = box
    ss, ds = tensor(g, src).shape, tensor(g, dst).shape
    nd = len(lens)
    j, width = nd - 1, lens[-1]
    while j > 0 and lens[j] == ss[j] == ds[j]:
        j -= 1
        width *= lens[j]
    sst, dst_ = _elem_strides(ss), _elem_strides(ds)
    if j == 0:
        rows, outer = 1, []
        spitch, dpitch = width, width
    else:
        rows, outer = lens[j - 1], list(range(j - 1))
        spitch, dpitch = sst[j - 1], dst_[j - 1]
    out = []
    for idx in np.ndindex(*(lens[i] for i in outer)):
        so = sum((s_lo[i] + (idx[outer.index(i)] if i in outer else 0)) * sst[i] for i in range(nd))
        do = sum((d_lo[i] + (idx[outer.index(i)] if i in outer else 0)) * dst_[i] for i in range(nd))
        out.append((src, srank, so, spitch, dst, drank, do, dpitch, width, rows))
    return out


def _elem_strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def table_lines(g: nx.DiGraph) -> tuple[str, ...]:
    """DMA_COPIES as lines of Python for the module template (one line per chunk)."""
    table = dma_table(g)
    if not table:
        return ()
    lines = []
    for q, rows in table.items():
        lines.append(f"    {q}: (")
        for param, counter, owner, copies in rows:
            lines.append(f"        ({param!r}, {counter}, {owner}, {copies!r}),")
        lines.append("    ),")
    return tuple(lines)
