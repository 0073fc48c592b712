"""AST of .tile programs: immutable nodes, each with the source location it came from."""

from __future__ import annotations

from dataclasses import dataclass

from tilec.errors import Loc

# ---- expressions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int:
    value: int
    loc: Loc


@dataclass(frozen=True)
class Float:
    value: float
    loc: Loc


@dataclass(frozen=True)
class Name:
    id: str
    loc: Loc


@dataclass(frozen=True)
class Full:
    """`:` in an index: the whole dimension."""

    loc: Loc


@dataclass(frozen=True)
class Ref:
    """`X[i, j]` (local copy), `X@r[i, j]` (rank r's copy of a symmetric tensor) or `X@(rank + 1)[i, j]` (the
    copy of the rank a peer expression names: `rank` holds the expression)."""

    tensor: str
    rank: str | Expr | None
    index: tuple[Expr, ...]
    loc: Loc


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / % @
    lhs: Expr
    rhs: Expr
    loc: Loc


@dataclass(frozen=True)
class Neg:
    operand: Expr
    loc: Loc


@dataclass(frozen=True)
class Call:
    """`f(x, y)`; `kw`: keyword arguments (`sum(x, dim=1)`) in order."""

    fn: str
    args: tuple[Expr, ...]
    loc: Loc
    kw: tuple[tuple[str, Expr], ...] = ()


@dataclass(frozen=True)
class Attr:
    """`x.T`: an attribute of a tile."""

    value: Expr
    name: str
    loc: Loc


@dataclass(frozen=True)
class Reduce:
    """`sum v in E by S: body` (a tile loop) or `sum v in ranks: body`."""

    var: str
    extent: Expr | None  # None: over ranks
    step: Expr | None
    body: Expr
    loc: Loc


Expr = Int | Float | Name | Ref | BinOp | Neg | Call | Attr | Reduce

# ---- declarations and statements ---------------------------------------------------------------


@dataclass(frozen=True)
class DimDef:
    name: str
    default: int | None
    loc: Loc


@dataclass(frozen=True)
class TileDef:
    name: str
    value: int
    loc: Loc


@dataclass(frozen=True)
class TensorDecl:
    kind: str  # in | out | buf
    name: str
    dtype: str
    shape: tuple[Expr, ...]
    symmetric: bool
    loc: Loc


@dataclass(frozen=True)
class Loop:
    var: str
    kind: str  # rank | tile
    extent: Expr | None
    step: Expr | None
    loc: Loc
    count: Ref | None = None  # `upto cnt[e]`: rows past the count are not valid (frontend/rows.py)


@dataclass(frozen=True)
class Assign:
    """`X[...] = e`, or `X[...], Y[...] = f(...)` for tile functions with several results (None: `_`)."""

    targets: tuple[Ref | None, ...]
    value: Expr
    loc: Loc


@dataclass(frozen=True)
class Stage:
    name: str
    loops: tuple[Loop, ...]
    body: tuple[Assign, ...]
    loc: Loc


@dataclass(frozen=True)
class Barrier:
    loc: Loc


@dataclass(frozen=True)
class Program:
    name: str
    world: str
    dims: tuple[DimDef, ...]
    tiles: tuple[TileDef, ...]
    tensors: tuple[TensorDecl, ...]
    items: tuple[Stage | Barrier, ...]
    loc: Loc
    source: str

    @property
    def stages(self) -> tuple[Stage, ...]:
        return tuple(i for i in self.items if isinstance(i, Stage))

    def tensor(self, name: str) -> TensorDecl | None:
        return next((t for t in self.tensors if t.name == name), None)
