"""Exact element regions of affine tile accesses, for the verifier.

An access `X@o[i_0, ..., i_n]` made by every task of a stage on every rank touches a set of (rank holding the
element, index_0, ..., index_n) points. Axis 0 is that rank (the access's rank variable, or `rank` itself), axis
d+1 tensor dim d: per task the interval [start, start + span) where start is the affine index and span the tile
var's extent in this task (min(step, extent - value): a ragged last tile reaches less).

Variables that share an axis form a component; a region is the product of its components' unions of boxes, so
it is enumerated per component (a rank var and a tile var: W * trips boxes) instead of per task or per element,
which keeps paper-size programs (millions of tasks, 10^8 elements) to milliseconds. Comparing two regions splits
the axes into blocks (the join of both component partitions): one-axis blocks are unions of intervals compared
exactly, wider blocks are rasterized. Anything beyond the limits raises Undecidable: the verifier rejects then.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from tilec.ir import peers
from tilec.ir.types import Access, Affine, Var, trips

LIMIT = 1 << 22  # variable-value combinations enumerated at once
CELLS = 1 << 23  # cells of one rasterized block


class Undecidable(Exception):
    """The question is too large to decide exactly within the limits."""


@dataclass(frozen=True)
class Comp:
    axes: tuple[int, ...]
    lo: np.ndarray  # (boxes, len(axes)): first element per axis
    hi: np.ndarray  # (boxes, len(axes)): one past the last element


@dataclass(frozen=True)
class Region:
    extent: tuple[int, ...]  # size of every axis: the world, then the tensor's shape
    comps: tuple[Comp, ...]
    free: tuple[Var, ...]  # domain variables with several values that the access does not depend on

    def point(self) -> list[int]:
        """Some element of the region (the first box of every component)."""
        out = [0] * len(self.extent)
        for c in self.comps:
            for j, a in enumerate(c.axes):
                out[a] = int(c.lo[0, j])
        return out


def axes_of(a: Access) -> list[tuple[Affine, str | None]]:
    """(affine start, tile var) per axis: the holding rank, then every dim."""
    return [(Affine(((a.rank, 1),), 0), None), *zip(a.index, a.tile, strict=True)]


def values(v: Var) -> np.ndarray:
    return np.arange(v.trips, dtype=np.int64) * v.step


def grid(vs: list[Var], what=None) -> dict[str, np.ndarray]:
    """Every combination of the variables' values, flattened (C order: the last var varies fastest). `what`
    (text, or a callable giving it, as formatting accesses costs more than enumerating them) names the question."""
    derived = [v for v in vs if v.derived is not None]  # computed from the others (ir/peers.py), not enumerated
    vs = [v for v in vs if v.derived is None]
    n = trips(vs)
    if n > LIMIT:
        what = what() if callable(what) else what
        raise Undecidable(f"{what}: {n} combinations of {', '.join(v.name for v in vs)} exceed {LIMIT}")
    if not vs:
        return peers.derive({}, {v.name: v for v in derived})
    mesh = np.meshgrid(*[values(v) for v in vs], indexing="ij")
    env = {v.name: m.ravel() for v, m in zip(vs, mesh, strict=True)}
    return peers.derive(env, {v.name: v for v in derived})


def interval(aff: Affine, tile: str | None, dom: dict[str, Var], env: dict[str, np.ndarray], n: int):
    """[lo, hi) per combination: the tile var (coefficient 1) spans min(step, extent - value) elements."""
    lo = np.full(n, aff.const, dtype=np.int64)
    for v, k in aff.terms:
        lo = lo + k * env[v]
    if tile is None:
        return lo, lo + 1
    t = dom[tile]
    return lo, lo + np.minimum(t.step, t.extent - env[tile])


def groups(axis_vars: list[set[str]]) -> list[list[int]]:
    """Axes joined when they share a variable (union-find), in axis order."""
    parent = list(range(len(axis_vars)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, vs in enumerate(axis_vars):
        for v in vs:
            if v in owner:
                parent[find(i)] = find(owner[v])
            else:
                owner[v] = i
    out: dict[int, list[int]] = {}
    for i in range(len(axis_vars)):
        out.setdefault(find(i), []).append(i)
    return list(out.values())


def skip_groups(axis_vars: list[set[str]], skip) -> list[tuple[list[int], list[str]]]:
    """Axis groups and their variables when `skip` pairs (variables whose equal values are not run, Stage.skip_equal)
    tie variables together: a pair joins the axes of both its variables, or adds a variable no axis uses to its
    partner's group. A group may have no axes (pairs of variables no axis uses)."""
    n = len(axis_vars)
    out = []
    for grp in groups([*axis_vars, *(set(p) for p in skip)]):
        vs = sorted(set().union(*(axis_vars[i] if i < n else set(skip[i - n]) for i in grp)))
        out.append(([i for i in grp if i < n], vs))
    return out


def grid_skip(vs: list[Var], skip, what=None) -> dict[str, np.ndarray]:
    """grid() without the combinations where a skip pair's two variables are equal."""
    env = grid(vs, what)
    keep = None
    for u, w in skip:
        if u in env and w in env:
            k = env[u] != env[w]
            keep = k if keep is None else keep & k
    return env if keep is None else {v: x[keep] for v, x in env.items()}


def region(a: Access, dom: dict[str, Var], world: int, shape: tuple[int, ...], what: str = "",
           skip: tuple[tuple[str, str], ...] = ()) -> Region:
    """The region of access `a` over every combination of the domain's variables (`dom` includes `rank`), but
    those where a `skip` pair's variables are equal (Stage.skip_equal)."""
    axes = axes_of(a)
    # a derived variable (a peer, an index piece: ir/peers.py) is computed from its inputs, which vary instead
    axis_vars = [peers.inputs(set(aff.vars) | ({tv} if tv else set()), dom) for aff, tv in axes]
    comps = []
    used: set[str] = set()
    for grp, vs in skip_groups(axis_vars, skip):
        env = peers.derive(grid_skip([dom[v] for v in vs], skip, what or (lambda: str(a))), dom)
        n = peers.combinations(env)
        if n == 0:  # every combination is skipped: nothing is accessed, which boxes cannot say
            raise Undecidable(f"{what or a}: every task is skipped")
        if not grp:  # variables the access does not depend on: free if they take several values together
            if n == 1:
                used |= set(vs)
            continue
        used |= set(vs)
        los, his = zip(*(interval(*axes[i], dom, env, n) for i in grp), strict=True)
        comps.append(Comp(tuple(grp), np.stack(los, axis=1), np.stack(his, axis=1)))
    comps.sort(key=lambda c: c.axes)
    free = tuple(v for name, v in dom.items() if name not in used and v.trips > 1)
    return Region((world, *shape), tuple(comps), free)


def full(extent: tuple[int, ...]) -> Region:
    """Every element: one box over every axis."""
    return Region(extent, tuple(Comp((i,), np.array([[0]]), np.array([[n]])) for i, n in enumerate(extent)), ())


def bounds(r: Region) -> tuple[list[int], list[int]]:
    """Smallest first element and largest one-past-last element per axis."""
    lo, hi = [0] * len(r.extent), [0] * len(r.extent)
    for c in r.comps:
        for j, a in enumerate(c.axes):
            lo[a], hi[a] = int(c.lo[:, j].min()), int(c.hi[:, j].max())
    return lo, hi


# ---- one-axis blocks: unions of intervals --------------------------------------------------------


def _merged(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted, maximal intervals of a union."""
    o = np.argsort(lo, kind="stable")
    lo, hi = lo[o], hi[o]
    top = np.maximum.accumulate(hi)
    new = np.ones(len(lo), dtype=bool)
    new[1:] = lo[1:] > top[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(lo)) - 1
    return lo[starts], top[ends]


def _uncovered_1d(big: list[tuple[np.ndarray, np.ndarray]], lo: np.ndarray, hi: np.ndarray) -> int | None:
    s, e = _merged(np.concatenate([b[0] for b in big]), np.concatenate([b[1] for b in big]))
    i = np.searchsorted(s, lo, side="right") - 1
    ok = (i >= 0) & (e[np.maximum(i, 0)] >= hi)
    if ok.all():
        return None
    j = int(np.flatnonzero(~ok)[0])
    if i[j] < 0 or e[i[j]] <= lo[j]:
        return int(lo[j])
    return int(e[i[j]])


def _common_1d(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int | None:
    s, e = _merged(*b)
    i = np.searchsorted(s, a[1], side="left") - 1  # the last interval of b starting before a's end
    ok = (i >= 0) & (e[np.maximum(i, 0)] > a[0])
    if not ok.any():
        return None
    j = int(np.flatnonzero(ok)[0])
    return int(max(a[0][j], s[i[j]]))


# ---- wider blocks: rasters -----------------------------------------------------------------------


def _count(c: Comp, ext: tuple[int, ...]) -> np.ndarray:
    """How many boxes of the component hold each cell (difference array over the component's axes)."""
    k = len(c.axes)
    diff = np.zeros(tuple(n + 1 for n in ext), dtype=np.int32)
    for corner in itertools.product((0, 1), repeat=k):
        idx = tuple(np.where(bit, c.hi[:, j], c.lo[:, j]) for j, bit in enumerate(corner))
        np.add.at(diff, idx, -1 if sum(corner) % 2 else 1)
    for j in range(k):
        diff = np.cumsum(diff, axis=j)
    return diff[tuple(slice(0, n) for n in ext)]


def _raster(r: Region, block: list[int]) -> np.ndarray:
    """Which cells of the block's axes the region holds (its components inside the block, multiplied out)."""
    ext = tuple(r.extent[a] for a in block)
    cells = int(np.prod(ext, dtype=np.int64))
    if cells > CELLS:
        raise Undecidable(f"a block of {cells} elements over several axes exceeds {CELLS}")
    occ = np.ones(ext, dtype=bool)
    for c in r.comps:
        if not set(c.axes) <= set(block):
            continue
        sub = _count(c, tuple(r.extent[a] for a in c.axes)) > 0
        occ &= sub.reshape([r.extent[a] if a in c.axes else 1 for a in block])
    return occ


def _join(rs) -> list[list[int]]:
    n = len(rs[0].extent)
    tags = [set() for _ in range(n)]
    for i, r in enumerate(rs):
        for j, c in enumerate(r.comps):
            for a in c.axes:
                tags[a].add((i, j))
    return groups(tags)


def _comp_on(r: Region, axis: int) -> Comp:
    return next(c for c in r.comps if axis in c.axes)


# ---- questions -----------------------------------------------------------------------------------


def _disjoint_1d(lo: np.ndarray, hi: np.ndarray) -> bool:
    o = np.argsort(lo, kind="stable")
    return bool((lo[o][1:] >= hi[o][:-1]).all())


def self_overlap(r: Region) -> tuple[str, list[int]] | None:
    """Whether two different variable combinations reach one element: (why, an element) or None."""
    if r.free:
        return f"'{r.free[0].name}' takes {r.free[0].trips} values", r.point()
    for c in r.comps:
        if len(c.axes) == 1:
            o = np.argsort(c.lo[:, 0], kind="stable")
            lo, hi = c.lo[o, 0], c.hi[o, 0]
            bad = np.flatnonzero(lo[1:] < hi[:-1])
            if len(bad):
                p = r.point()
                p[c.axes[0]] = int(lo[bad[0] + 1])
                return "tiles overlap", p
        elif not any(_disjoint_1d(c.lo[:, j], c.hi[:, j]) for j in range(len(c.axes))):
            # no single axis keeps the boxes apart (a diagonal one does): count them cell by cell
            cnt = _count(c, tuple(r.extent[a] for a in c.axes))
            hit = np.argwhere(cnt > 1)
            if len(hit):
                p = r.point()
                for j, a in enumerate(c.axes):
                    p[a] = int(hit[0][j])
                return "tiles overlap", p
    return None


def uncovered(big: list[Region], small: Region) -> list[int] | None:
    """An element of `small` that no region of `big` holds, or None when `big` covers `small`."""
    if not big:
        return small.point()
    if len(big) > 1:
        return _uncovered_union(big, small)
    (b,) = big
    for block in _join([b, small]):
        if len(block) == 1:
            a = block[0]
            cb, cs = _comp_on(b, a), _comp_on(small, a)
            x = _uncovered_1d([(cb.lo[:, 0], cb.hi[:, 0])], cs.lo[:, 0], cs.hi[:, 0])
            if x is not None:
                p = small.point()
                p[a] = x
                return p
        else:
            hole = np.argwhere(_raster(small, block) & ~_raster(b, block))
            if len(hole):
                p = small.point()
                for j, a in enumerate(block):
                    p[a] = int(hole[0][j])
                return p
    return None


def _uncovered_union(big: list[Region], small: Region) -> list[int] | None:
    every = list(range(len(small.extent)))
    cells = int(np.prod(small.extent, dtype=np.int64))
    if cells <= CELLS:
        occ = np.zeros(small.extent, dtype=bool)
        for b in big:
            occ |= _raster(b, every)
        hole = np.argwhere(_raster(small, every) & ~occ)
        return [int(x) for x in hole[0]] if len(hole) else None
    for b in big:  # a single region that covers everything settles it; otherwise it cannot be decided here
        if uncovered([b], small) is None:
            return None
    raise Undecidable(f"coverage of {cells} elements by {len(big)} regions exceeds {CELLS}")


def common(a: Region, b: Region) -> list[int] | None:
    """An element both regions hold, or None."""
    p = [0] * len(a.extent)
    for block in _join([a, b]):
        if len(block) == 1:
            x = block[0]
            ca, cb = _comp_on(a, x), _comp_on(b, x)
            y = _common_1d((ca.lo[:, 0], ca.hi[:, 0]), (cb.lo[:, 0], cb.hi[:, 0]))
            if y is None:
                return None
            p[x] = y
        else:
            both = np.argwhere(_raster(a, block) & _raster(b, block))
            if not len(both):
                return None
            for j, x in enumerate(block):
                p[x] = int(both[0][j])
    return p
