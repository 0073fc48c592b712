"""Emitting data-dependent rows (ir/gather.py) as kernel-IR nodes: a gathered load reads its index tile, checks
every live index is a row of its dim (td.rows_ok: the first offence goes to the error word, the lane is masked) and
offsets each row by its value; a counted loop's lanes past its count (read once per task, td.count_ok) are masked
in every access it indexes, so those rows are neither loaded nor stored."""

from __future__ import annotations

from tilec.ir.gather import Counted, Gathered, check_number
from tilec.ir.graph import program_of, tensor
from tilec.ir.types import Access, Affine, Load

from . import kir as K
from .build import At, E, add, assign, bcast, call, cmp, conj, mul, plus, to
from .text import row_major_strides


def _number(em, tensor_name: str, loc) -> int:
    return check_number(program_of(em.g).items, tensor_name, loc)


def offsets(em, a: Gathered, out: list, indent: str) -> tuple[K.Expr, K.Expr | None]:
    """Pointer offset and mask of a gathered tile: the affine dims as `Copies.offsets` makes them, each gathered dim
    its index tile's values (statements that load and check them placed in `out`)."""
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
        v = to(vals, "tl.int64") if t.numel >= 2**31 else E(vals)
        parts.append(mul(bcast(v, d, nd), st[d]) if st[d] != 1 else bcast(v, d, nd))
        masks.append(bcast(ok, d, nd))
    return plus(*parts), conj(masks)


def load(em, e: Load, out: list, indent: str) -> K.Expr:
    """A gathered tile read (Copies.load for an access with data-dependent rows)."""
    a = e.access
    for w in em.waits.pop(a, []):  # the conservative waits: every producer tile of the rows it may hit
        em.wait(w, out, indent)
    off, mask = offsets(em, a, out, indent)
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
