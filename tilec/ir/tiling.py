"""Inverting affine tile writes: which producer task wrote element e of a tensor.

A write index is solvable per dimension when each dimension is `c + a*r + t`: at most one outer variable r
(a rank variable with a != 0, or a tile loop of step 1 with a > 0) and at most one tile variable t (coefficient 1).
Then for an element e of that dimension:
    r = (e - c) // a,   offset = e - c - a*r,   tile = offset // step      (offset >= extent: a gap, never written)
where a negative a (a reversed order of ranks, `(W-1-r)*M/W + m`) divides as
    r = n - 1 - (e - c - a*(n - 1)) // -a      (n values of r; `rank_of`)
so the offset is again in [0, |a|), and its flag counters count the ranks from the last (`lin_of`).
This one fact turns barriers into per-tile flags (consumers compute the producer tiles they read), lets fused-pull
read a buffer's source directly, and lets the verifier check both by brute force.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilec.errors import ScheduleError
from tilec.ir.types import Access, Var


@dataclass(frozen=True)
class DimInverse:
    dim: int
    const: int
    rank_var: str | None
    rank_coef: int
    tile_var: str | None
    step: int
    extent: int
    key_rank: bool  # the rank var indexes the flag
    key_tile: bool  # the tile var indexes the flag
    world: int  # number of values of the outer variable (the world size for a rank variable)

    @property
    def trips(self) -> int:
        return -(-self.extent // self.step) if self.tile_var else 1

    @property
    def size(self) -> int:
        return (self.world if self.key_rank else 1) * (self.trips if self.key_tile else 1)

    @property
    def block(self) -> int:
        """How many elements of this dim one value of the rank var spans (|a|)."""
        return abs(self.rank_coef)

    def solve(self, e):
        """Element index (int or numpy array) -> (rank value, offset within the tile var's range)."""
        x = e - self.const
        r = rank_of(x, self.rank_coef, self.world) if self.rank_var else x * 0
        return r, x - (self.rank_coef * r if self.rank_var else 0)

    def written(self, e):
        """Whether element e of this dim is written by some producer task."""
        r, off = self.solve(e)
        ok = (off >= 0) & (off < (self.extent if self.tile_var else 1))
        if self.rank_var:
            ok = ok & (r >= 0) & (r < self.world)
        return ok

    def lin(self, e, clamp: bool = True):
        """Flag coordinate of element e along this dim; clamped into range for gap elements unless clamp=False
        (as the generated wait loops compute it)."""
        r, off = self.solve(e)
        t = off // self.step if self.tile_var else 0
        if clamp:
            t = np.clip(t, 0, self.trips - 1) if self.tile_var else 0
            r = np.clip(r, 0, self.world - 1) if self.rank_var else 0
        return self.lin_of(r, t) + e * 0  # an array like e, also when no part of this dim is keyed

    def lin_of(self, r, t):
        """Flag coordinate from the producer's own (rank value, tile number). A reversed order counts its ranks
        from the last (n - 1 - r), so the coordinate grows with the element as it does for the others and a read's
        counters stay one range."""
        if self.rank_var and self.rank_coef < 0:
            r = self.world - 1 - r
        out = r * (self.trips if self.key_tile else 1) if self.key_rank else 0
        return out + (t if self.key_tile else 0)


def rank_of(x, a: int, n: int):
    """The r of x = a*r + offset with offset in [0, |a|): x // a for a > 0; for a reversed order (a < 0) of n
    values n - 1 - (x - a*(n - 1)) // -a, as the kernels compute it (codegen/build.rank_div)."""
    return x // a if a > 0 else n - 1 - (x - a * (n - 1)) // -a


def invert(write: Access, loops: dict[str, Var], key: set[str], world: int, what: str) -> list[DimInverse]:
    """Per-dim inverses of `write` (a stage's store) or a ScheduleError saying why it is not invertible."""
    out = []
    for d, aff in enumerate(write.index):
        # a loop of one element (extent 1) is always 0 and does not locate anything
        aff = type(aff)(tuple((v, k) for v, k in aff.terms if loops[v].is_rank or loops[v].extent > 1), aff.const)
        ranks = [(v, k) for v, k in aff.terms if loops[v].is_rank or loops[v].step == 1]
        tiles = [(v, k) for v, k in aff.terms if not (loops[v].is_rank or loops[v].step == 1)]
        if len(ranks) > 1:
            raise ScheduleError(f"{what}: dim {d} of {write} combines several rank or unit-step variables"
                                f" ({', '.join(v for v, _k in ranks)}), so its producer tiles cannot be solved per"
                                " element")
        if ranks and ranks[0][1] < 0 and not loops[ranks[0][0]].is_rank:
            raise ScheduleError(f"{what}: dim {d} of {write} walks unit-step loop '{ranks[0][0]}' backwards, so its"
                                " producer tiles cannot be solved per element")
        rv, rk = ranks[0] if ranks else (None, 1)
        n_outer = (world if loops[rv].is_rank else loops[rv].extent) if rv else world
        tv = tiles[0][0] if tiles else None
        if tv is None and rv is None:
            step, extent = 1, 1
        elif tv is None:
            step, extent = 1, 1
        else:
            step, extent = loops[tv].step, loops[tv].extent
        out.append(DimInverse(d, aff.const, rv, rk, tv, step, extent, rv in key, tv in key if tv else False, n_outer))
    return out


def strides(dims: list[DimInverse]) -> list[int]:
    s, out = 1, []
    for d in reversed(dims):
        out.append(s)
        s *= d.size
    return out[::-1]


def flag_size(dims: list[DimInverse]) -> int:
    n = 1
    for d in dims:
        n *= d.size
    return n
