"""IR payloads: immutable, numerically resolved (dims are bound at compile time), each with its source location."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from tilec.errors import Loc

ME = "rank"  # the builtin rank variable: the rank executing a task


@dataclass(frozen=True)
class Var:
    """A loop variable. Tile vars step over element offsets [0, extent) by `step`; rank vars take 0..W-1."""

    name: str
    kind: str  # "tile" | "rank" | "me" | "peer" / "piece" (derived, ir/peers.py)
    extent: int
    step: int
    loc: Loc = field(compare=False, repr=False)
    derived: object = field(default=None, kw_only=True)  # a peers.Piece: one trip, every task computes it


    @property
    def trips(self) -> int:
        return -(-self.extent // self.step)

    @property
    def is_rank(self) -> bool:
        return self.kind in ("rank", "me", "peer")


def trips(loops: Iterable[Var]) -> int:
    """The iterations of a loop nest (a stage's tasks, a reduction's steps): the product of its loops' trips."""
    return math.prod(v.trips for v in loops)


@dataclass(frozen=True)
class Affine:
    """sum(coef * var) + const over loop variables; element offsets."""

    terms: tuple[tuple[str, int], ...]
    const: int

    def coef(self, var: str) -> int:
        return dict(self.terms).get(var, 0)

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    def subst(self, var: str, repl: Affine) -> Affine:
        c = self.coef(var)
        if not c:
            return self
        terms = {v: k for v, k in self.terms if v != var}
        for v, k in repl.terms:
            terms[v] = terms.get(v, 0) + c * k
        return Affine(tuple(sorted((v, k) for v, k in terms.items() if k)), self.const + c * repl.const)

    def rename(self, mapping: dict[str, str]) -> Affine:
        terms: dict[str, int] = {}
        for v, k in self.terms:
            nv = mapping.get(v, v)
            terms[nv] = terms.get(nv, 0) + k
        return Affine(tuple(sorted((v, k) for v, k in terms.items() if k)), self.const)

    def __str__(self) -> str:
        parts = [(v if k == 1 else f"{k}*{v}") for v, k in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True)
class Tensor:
    name: str
    kind: str  # in | out | buf
    dtype: str
    shape: tuple[int, ...]
    symmetric: bool
    loc: Loc = field(compare=False, repr=False)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Access:
    """A tile of `tensor` on rank `rank` (a rank var name; ME is the executing rank). Per dim: the affine start
    offset, the tile var that spans it (None: a single element) and the tile extent."""

    tensor: str
    rank: str
    index: tuple[Affine, ...]
    tile: tuple[str | None, ...]
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)

    @property
    def remote(self) -> bool:
        return self.rank != ME

    @property
    def vars(self) -> set[str]:
        out = {v for a in self.index for v in a.vars}
        if self.rank != ME:
            out.add(self.rank)
        return out

    def __str__(self) -> str:
        at = "" if self.rank == ME else f"@{self.rank}"
        return f"{self.tensor}{at}[{', '.join(str(i) for i in self.index)}]"


# ---- tile expressions ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    access: Access
    dtype: str
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Const:
    value: float | int
    dtype: str
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Op:
    """Elementwise op or tile function: + - * / neg exp log sqrt max min relu silu sigmoid tanh abs cast_*; or an
    operation inside one tile (ir/tile_ops.py): sum_dim / max_dim / min_dim (attr: the dim), permute (attr: the
    permutation; `x.T` is (1, 0))."""

    op: str
    args: tuple[TExpr, ...]
    dtype: str
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)
    attr: tuple[int, ...] = ()


@dataclass(frozen=True)
class Dot:
    lhs: TExpr
    rhs: TExpr
    dtype: str
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Sum:
    """A reduction over a tile loop (accumulates in f32) or over ranks."""

    var: Var
    body: TExpr
    dtype: str
    shape: tuple[int, ...]
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Idx:
    """An integer scalar computed from loop variables, dims and the rank (e.g. `rank*S + j*BS`)."""

    index: Affine
    dtype: str = "i32"
    shape: tuple[int, ...] = ()
    loc: Loc = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TupleCall:
    """A tile-library function with several results: attend -> (o, lse), lse_merge -> (o, lse).
    `outs` gives each result's (dtype, squeezed shape)."""

    fn: str
    args: tuple[TExpr, ...]
    outs: tuple[tuple[str, tuple[int, ...]], ...]
    loc: Loc = field(compare=False, repr=False)

    @property
    def dtype(self) -> str:
        return self.outs[0][0]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.outs[0][1]


TExpr = Load | Const | Op | Dot | Sum | Idx | TupleCall


@dataclass(frozen=True)
class Store:
    """Store `value` (or result `part` of a TupleCall) into the tile `access`."""

    access: Access
    value: TExpr
    loc: Loc = field(compare=False, repr=False)
    part: int | None = None


def walk(e: TExpr):
    """Pre-order traversal of a tile expression."""
    yield e
    if isinstance(e, Op | TupleCall):
        for a in e.args:
            yield from walk(a)
    elif isinstance(e, Dot):
        yield from walk(e.lhs)
        yield from walk(e.rhs)
    elif isinstance(e, Sum):
        yield from walk(e.body)


def loads(e: TExpr) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load)]


def map_expr(e: TExpr, fn) -> TExpr:
    """Rebuild `e` bottom-up, applying fn to every node (fn returns the node or a replacement)."""
    from dataclasses import replace

    if isinstance(e, Op | TupleCall):
        e = replace(e, args=tuple(map_expr(a, fn) for a in e.args))
    elif isinstance(e, Dot):
        e = replace(e, lhs=map_expr(e.lhs, fn), rhs=map_expr(e.rhs, fn))
    elif isinstance(e, Sum):
        e = replace(e, body=map_expr(e.body, fn))
    return fn(e)


def squeeze(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(n for n in shape if n != 1)


def logical_shape(e) -> tuple[int, ...]:
    """The shape tile functions see: a load keeps the dims it spans with a tile loop or `:` (even of extent 1)
    and drops the dims indexed by one element; other expressions drop extent-1 dims."""
    if isinstance(e, Load):
        return tuple(n for n, tv in zip(e.shape, e.access.tile, strict=True) if tv is not None)
    return squeeze(e.shape)


def reduction_vars(e: TExpr) -> list[Var]:
    return [x.var for x in walk(e) if isinstance(x, Sum)]
