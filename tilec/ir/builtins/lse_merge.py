"""lse_merge(o, lse) -> (O, L): merge softmax partials over the first dim, O = sum_i exp(lse_i - L) o_i."""

from __future__ import annotations

from .base import TileFn


def _check(shapes, args):
    if len(args) != 2:
        return "lse_merge(o, lse) takes 2 arguments"
    o, lse = shapes
    if len(o) < 2 or o[:-1] != lse:
        return (f"lse_merge(o, lse) needs o [N, ..., D] and lse [N, ...]; got [{', '.join(map(str, o))}],"
                f" [{', '.join(map(str, lse))}]")
    return (("f32", o[1:]), ("f32", lse[1:]))


def _reference(o, lse):
    import torch

    o, lse = o.float(), lse.float()
    big = torch.logsumexp(lse, dim=0)
    w = torch.exp(lse - torch.where(torch.isinf(big), 0, big))
    return (w[..., None] * o).sum(0), big


def _emit(em, call, args, results):
    from tilec.ir.types import logical_shape

    ov, lv = (logical_shape(a) for a in call.args)
    m = 1
    for x in lv[1:]:
        m *= x
    n_valid = em.rows_valid(call.args[1])  # partials past the true count are padding
    n_valid = lv[0] if n_valid is None else n_valid
    b = em.kb
    return b.assign(b.tup(*results), b.call("td.lse_merge", b.call("tl.reshape", args[0], b.tup(ov[0], m, ov[-1])),
                                            b.call("tl.reshape", args[1], b.tup(lv[0], m)), n_valid))


# a merge of partials that other tasks computed moves data more than it computes
LSE_MERGE = TileFn("lse_merge", "lse_merge(o, lse)", 2, _check, _reference, _emit, device=("lse_merge",),
                   moves_data=True)
