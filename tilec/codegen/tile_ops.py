"""Kernel-IR of the operations inside one tile (their shape rules: ir/tile_ops.py): reductions along a dim
(`tl.sum` / `tl.max` / `tl.min` with `axis`), permutations (`tl.trans`, `tl.permute`), operands taken to their
logical shape (`tl.reshape`), and tiles of lower rank broadcast by numpy's rule (`x[None, :]`)."""

from __future__ import annotations

from tilec.ir import tile_ops
from tilec.ir.graph import Pull
from tilec.ir.types import Load, Op, logical_shape

from . import kir as K
from .build import E, call, tup

# the padding lanes of a ragged tile hold these while a reduction runs (loads give 0 there, which is a value)
_IDENTITY = {"sum_dim": E(0.0), "max_dim": call("float", K.Const("-inf")), "min_dim": call("float", K.Const("inf"))}
_TL = {"sum_dim": "tl.sum", "max_dim": "tl.max", "min_dim": "tl.min"}


def is_tile_op(e) -> bool:
    return isinstance(e, Op) and (e.op == tile_ops.PERMUTE or e.op in _TL)


def logical(x: K.Expr, e) -> K.Expr:
    """Value x of expression e reshaped to e's logical shape (dims a load indexes by one element dropped)."""
    shape = logical_shape(e)
    return x if tuple(e.shape) == shape else call("tl.reshape", x, tup(*shape) if shape else tup(1))


def matrix(x: K.Expr, e) -> K.Expr:
    """An operand of `@` as the [rows, cols] matrix sema took it as."""
    shape = tile_ops.matrix_shape(e.shape)
    return x if tuple(e.shape) == shape else call("tl.reshape", x, tup(*shape))


def padded(x: K.Expr, e, nd: int) -> K.Expr:
    """Value x of e (a tile of fewer than nd dims) with leading axes of size 1, as numpy broadcasting aligns it."""
    n = len(e.shape)
    if not n or n >= nd:
        return x
    return K.Index(x, tuple([K.Const(None)] * (nd - n) + [K.Slice()] * n))


def emit(em, e: Op, x: K.Expr) -> K.Expr:
    """The value of a reduction or permutation e of the value x of its argument."""
    arg = e.args[0]
    x = logical(x, arg)
    if e.op == tile_ops.PERMUTE:
        if e.attr == (1, 0):
            return call("tl.trans", x)
        return call("tl.permute", x, tup(*e.attr))
    d, keep = e.attr
    mask = None if e.op == "sum_dim" and isinstance(arg, Load | Pull) else _valid_along(em, arg, d)  # loads give 0
    if mask is not None:
        x = call("tl.where", mask, x, _IDENTITY[e.op])
    return call(_TL[e.op], x, axis=d, **({"keep_dims": True} if keep else {}))


def _valid_along(em, arg, d: int) -> K.Expr | None:
    """Where the lanes of logical dim d of a tile are real (a ragged or padded tile var), broadcast over the tile;
    None when every lane is. A computed tile's padding is that of the load of its full shape it is made of,
    followed through element-wise ops (the first such operand)."""
    load = arg
    while isinstance(load, Op) and not is_tile_op(load):
        full = [a for a in load.args if logical_shape(a) == logical_shape(arg)]
        if not full:
            return None
        load = full[0]
    if not isinstance(load, Load | Pull) or len(logical_shape(load)) != len(logical_shape(arg)):
        return None
    tiles = [t for t in (load.access if isinstance(load, Load) else load.read).tile if t]
    if d >= len(tiles):
        return None
    v = em.scope.get(tiles[d])
    if v is None or v.extent % v.step == 0:
        return None
    m = em.mask_of(v)
    if m is None:
        return None
    nd = len(tiles)
    return m if nd == 1 else K.Index(m, tuple(K.Slice() if i == d else K.Const(None) for i in range(nd)))


__all__ = ["E", "emit", "is_tile_op", "logical", "matrix", "padded"]
