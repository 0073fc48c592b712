"""Emitting data-dependent rows (ir/gather.py) as kernel-IR nodes: a gathered load reads its index tile, checks
every live index is a row of its dim (td.rows_ok: the first offence goes to the error word, the lane is masked) and
offsets each row by its value; a counted loop's lanes past its count (read once per task, td.count_ok) are masked
in every access it indexes, so those rows are neither loaded nor stored."""

from __future__ import annotations

import math

from tilec.ir.gather import Counted, Gathered, check_number, claim_tensor
from tilec.ir.graph import folds, program_of, tensor
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import strides
from tilec.ir.types import ME, Access, Affine, Load

from . import kir as K
from .build import At, E, S, add, assign, bcast, call, cmp, conj, mul, plus, shifted, to
from .flags import _lin
from .text import ident, row_major_strides


def _number(em, tensor_name: str, loc, what: str | None = None) -> int:
    return check_number(program_of(em.g).items, tensor_name, loc, what)


def offsets(em, a: Gathered, out: list, indent: str, rows_out: dict | None = None) -> tuple[K.Expr, K.Expr | None]:
    """Pointer offset and mask of a gathered tile: the affine dims as `Copies.offsets` makes them, each gathered dim
    its index tile's values (statements that load and check them placed in `out`; `rows_out`: dim -> (the values,
    the lanes in range))."""
    t = tensor(em.g, a.tensor)
    st = row_major_strides(t.shape)
    nd = len(a.index)
    rows = {r.dim: r for r in a.rows}
    view = Access(a.tensor, a.rank, tuple(Affine((), 0) if d in rows else x for d, x in enumerate(a.index)),
                  tuple(None if d in rows else tv for d, tv in enumerate(a.tile)), a.shape, a.loc)
    off, mask = em.offsets(view)
    parts, masks = [off], [mask] if mask is not None else []
    for d, r in rows.items():
        ia = r.index
        ioff, imask = em.offsets(ia)
        vals = em.tmp(f"{ia.tensor.lower()}_rows")
        kw = {"mask": imask, "other": 0} if imask is not None else {}
        out.append(At(indent, assign(vals, call("load", add(em.param(ia.tensor), ioff), **kw))))
        live = imask if imask is not None else cmp(ioff, ">=", 0)
        ok = em.tmp(f"{ia.tensor.lower()}_ok")
        out.append(At(indent, assign(ok, call("td.rows_ok", vals, ioff, live, r.size, "ERR",
                                              _number(em, ia.tensor, r.loc)),
                                     f"rows of {a.tensor} from {ia.tensor}: each must be 0..{r.size - 1}")))
        if rows_out is not None:
            rows_out[d] = (E(vals), E(ok))
        v = to(vals, "tl.int64") if t.numel >= 2**31 else E(vals)
        parts.append(mul(bcast(v, d, nd), st[d]) if st[d] != 1 else bcast(v, d, nd))
        masks.append(bcast(ok, d, nd))
    return plus(*parts), conj(masks)


def load(em, e: Load, out: list, indent: str) -> K.Expr:
    """A gathered tile read (Copies.load for an access with data-dependent rows)."""
    a = e.access
    ws = em.waits.pop(a, [])
    rows: dict[int, tuple[K.Expr, K.Expr]] = {}
    off, mask = offsets(em, a, out, indent, rows)
    for w in ws:
        if not row_wait(em, w, a, rows, out, indent):  # the conservative wait: every producer tile of the dim
            em.wait(w, out, indent)
    ptr = em.param(a.tensor)
    kw = {"mask": mask, "other": 0} if mask is not None else {}
    if a.remote:
        delta = em.peer_offset(E(a.rank), tensor(em.g, a.tensor).dtype, {a.rank}, out, indent)
        value = call("load", add(ptr, delta, off), **kw)
    else:
        value = call("load", add(ptr, off), **kw)
    name = em.tmp(f"{a.tensor.lower()}_tile")
    out.append(At(indent, assign(name, value)))
    return E(name)


def count_mask(em, v: Counted, r: str | None) -> K.Expr:
    """The lanes of counted loop v's index vector below its count of valid rows (the count read and checked once
    per task, in its prologue)."""
    counts = em.__dict__.setdefault("row_counts", {})
    if v.name not in counts:
        a = v.count
        pos = em.scalar(a.index[0].terms, a.index[0].const)
        raw, n = em.tmp(f"{a.tensor.lower()}_val"), em.tmp(f"{v.name}_count")
        em.prologue += [At("    ", assign(raw, call("load", add(em.param(a.tensor), pos)))),
                        At("    ", assign(n, call("td.count_ok", raw, pos, v.extent, "ERR",
                                                  _number(em, a.tensor, a.loc)),
                                          f"rows of '{v.name}' past {a} are not valid"))]
        counts[v.name] = E(n)
    return cmp(r or v.name + "_r", "<", counts[v.name])


def row_wait(em, w, a: Gathered, rows: dict, out: list, indent: str) -> bool:
    """Wait, chosen at run time, for only the producer tiles the index values land in: one counter per row (the
    counter of the producer tile that stores it, flags._lin of the row), polled together (td.wait_all) on the lanes
    in range. Where the flag keys a dim other than the one gathered dim, or the owner varies inside a loop, nothing
    is emitted (False): the caller emits the conservative wait on every tile of the dim."""
    f = em.fl[w.flag]
    if any(fo.flag == f.name and fo.consumer == em.st.name for fo in folds(em.g)) or len(rows) != 1:
        return False
    (d, (vals, ok)), = rows.items()
    dims = flag_dims(em.g, f.member(a.tensor))
    if any(x.size > 1 for x in dims if x.dim != d) or dims[d].size == 1:
        return False
    owner = "rank" if a.rank == ME else a.rank
    if owner in em.loop_vars:
        return False
    idx = _lin(dims[d], vals)
    stride = strides(dims)[d]
    fp = em.param(f"F_{ident(f.name)}")
    out.append(At(indent, K.Comment(f"wait until stage {f.producer} has written the rows of {a} the index names")))
    out.append(At(indent, K.Do(call("wait_all", fp, idx if stride == 1 else mul(idx, stride), ok, mul("epoch", f.count),
                                    "rank", owner, "heap_bases", "ERR", "timeout_ns", em.flag_no[f.name],
                                    S(em.flag_scope[f.name]), E("INTERPRET")))))
    return True


def skip_empty(em, body: list) -> list:
    """A task of a counted loop whose rows all lie past their count computes nothing: its body (not its releases,
    which follow) under `if v < count` for every counted loop v."""
    loops = [v for v in em.st.loops if isinstance(v, Counted)]
    if not loops:
        return body
    for v in loops:
        count_mask(em, v, None)
    cond = conj([cmp(v.name, "<", em.row_counts[v.name]) for v in loops])
    return [At("    ", K.If(cond, (), (), "rows below the count: compute and store them")),
            *(shifted(x, 4) for x in body)]


def store_offsets(em, a: Access, out: list, indent: str) -> tuple[K.Expr, K.Expr | None]:
    """Pointer offset and mask of a store (Copies.offsets), a scatter's rows checked in range and claimed: each live
    row's word of the claims buffer is exchanged for the call's epoch (tl.atomic_xchg); a row whose word already held
    it was written by another lane or task of this call, is masked and recorded (td.rows_unique)."""
    if not isinstance(a, Gathered):
        return em.offsets(a)
    rows: dict[int, tuple[K.Expr, K.Expr]] = {}
    off, mask = offsets(em, a, out, indent, rows)
    (d, (vals, ok)), = rows.items()
    r = a.row(d)
    nd = len(a.index)
    old, uniq = em.tmp("claimed"), em.tmp(f"{r.index.tensor.lower()}_once")
    # a row's word at the task's first element of the other dims (frontend/rows.py): tasks that split the row
    # claim words of their own
    shape = tensor(em.g, a.tensor).shape
    others = [(x, n) for j, (x, n) in enumerate(zip(a.index, shape, strict=True)) if j != d]
    per_row = math.prod(n for _x, n in others)
    parts = [mul(vals, per_row) if per_row != 1 else E(vals)]
    for (x, _n), stride in zip(others, row_major_strides(tuple(n for _x, n in others)), strict=True):
        if x.terms or x.const:
            start = em.scalar(x.terms, x.const)
            parts.append(start if stride == 1 else mul(start, stride))
    at = add(*parts)
    out.append(At(indent, assign(old, call("tl.atomic_xchg", add(em.param(claim_tensor(a.tensor)), at), "epoch",
                                           mask=ok), f"claim the rows of {a.tensor} this task writes")))
    pos, _ = em.offsets(r.index)
    out.append(At(indent, assign(uniq, call("td.rows_unique", old, vals, pos, ok, "epoch", "ERR",
                                            _number(em, r.index.tensor, r.loc, "unique")))))
    return off, K.Bin("&", mask, bcast(uniq, d, nd)) if mask is not None else bcast(uniq, d, nd)
