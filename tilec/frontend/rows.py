"""Sema of data-dependent rows (ir/gather.py): `X[idx[t], :]`, a row index read from an i32 tensor, and
`c in C by BC upto cnt[e]`, a loop whose rows past a count are not valid.

What is proven here: the index and count tensors are 1-D i32 inputs, read at affine, in-bounds elements; a gathered
dim covers its whole range for every dependence (a one-trip variable over the dim, as `:` makes). What is left to
run time: every index value is a row of its dim and every count is within its loop's extent (codegen/gathers.py).
A store through an index (a scatter) must write distinct rows, which the program cannot prove: every call checks it
(each row is claimed in an internal i32 buffer per scattered tensor, `_claims_X`, by an atomic exchange of the
call's epoch; a row claimed twice is an error).
"""

from __future__ import annotations

import math

from tilec.frontend import ast
from tilec.frontend.affine import NotAffine
from tilec.ir.gather import Counted, Gathered, Rows, claim_tensor
from tilec.ir.types import Access, Affine, Tensor, Var


class RowError(NotAffine):
    """A located problem with a row index or a count (sema reports it like its own)."""


def _index_tensor(chk, r: ast.Ref, what: str):
    t = chk.tensors.get(r.tensor)
    if t is None:
        raise RowError(r.loc, f"unknown tensor '{r.tensor}'")
    if t.dtype != "i32":
        raise RowError(r.loc, f"{what} '{t.name}' must be an i32 tensor, not {t.dtype}")
    if len(t.shape) != 1:
        raise RowError(r.loc, f"{what} '{t.name}' must be 1-D, not {len(t.shape)}-D (flatten it: `{t.name}[e*C + c]`)")
    if t.kind != "in":
        raise RowError(r.loc, f"{what} '{t.name}' must be an input ('in'): a tensor a stage writes cannot index rows")
    if r.rank is not None:
        raise RowError(r.loc, f"{what} '{t.name}' must be this rank's own copy (no '@{r.rank}')")
    return t


def row_dim(chk, e: ast.Ref, target, dim: int, vars_: dict[str, Var], write: bool, peer: str | None = None):
    """Dim `dim` of an access of `target` indexed by the values of `e`: (affine start, tile var, tile extent, Rows)
    with the start and tile var spanning the whole dim (the conservative region)."""
    _index_tensor(chk, e, "row index")
    ia = chk.access(e, vars_)
    if write and peer is not None:
        raise RowError(e.loc, f"a scatter writes this rank's own copy of '{target.name}', not '{target.name}@{peer}'"
                              " (its rows are claimed on this rank): scatter locally, then copy")
    if write:  # a scatter: its rows must be distinct, which every call checks (claims, codegen/gathers.py)
        claims = claim_tensor(target.name)
        # one word per row and element of the other dims: the tasks that split a row's other dims (`n in H by BN`)
        # each claim the row at their own first element, so they do not take one another for a repeated row
        shape = (target.shape[dim], math.prod(target.shape) // target.shape[dim])
        if claims in chk.tensors and chk.tensors[claims].shape != shape:
            raise RowError(e.loc, f"'{target.name}' is scattered along two dims: one dim only")
        chk.tensors.setdefault(claims, Tensor(claims, "buf", "i32", shape, False, e.loc))
    if isinstance(ia, Gathered):
        raise RowError(e.loc, f"row index '{e.tensor}' is itself indexed by a tensor: one level of indexing only")
    n = target.shape[dim]
    v = chk.new_slice(n, e.loc)
    vars_[v.name] = v
    rows = ia.shape[0]
    return Affine(((v.name, 1),), 0), v.name, rows, Rows(dim, ia, n, e.loc)


def gathered(a: Access, rows: list[Rows]) -> Access:
    if not rows:
        return a
    return Gathered(a.tensor, a.rank, a.index, a.tile, a.shape, a.loc, tuple(rows))


def counted(chk, v: Var, count: ast.Ref, vars_: dict[str, Var]) -> Counted:
    """Loop v with its count of valid rows read from `count`: one element, indexed by earlier loops and by v itself
    as a scalar (the task's first row: a per-block count, `ends[r*S + j]`)."""
    _index_tensor(chk, count, "row count")
    if any(isinstance(i, ast.Full | ast.Ref) for i in count.index):
        raise RowError(count.loc, f"the count of loop '{v.name}' must be one element of '{count.tensor}'")
    a = chk.access(count, {**vars_, v.name: Var(v.name, "tile", v.extent, 1, v.loc)})  # v: its tile's first row
    if isinstance(a, Gathered) or any(a.shape[d] != 1 or tv is not None for d, tv in enumerate(a.tile)):
        raise RowError(count.loc, f"the count of loop '{v.name}' must be one element of '{count.tensor}' (index it"
                                  " with loops, not a tile)")
    return Counted(v.name, v.kind, v.extent, v.step, v.loc, a)
