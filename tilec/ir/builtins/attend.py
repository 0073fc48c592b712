"""attend(q, k, v, n) -> (o, lse): one split of online-softmax attention over the first n rows of k and v."""

from __future__ import annotations

import math

from tilec.ir.types import squeeze

from .base import TileFn


def _check(shapes, args):
    if len(args) != 4:
        return "attend(q, k, v, n) takes 4 arguments"
    q, k, v, _n = shapes
    n = squeeze(args[3].shape)
    if len(k) != 2 or k != v or len(q) not in (1, 2) or q[-1] != k[1] or n != () or args[3].dtype != "i32":
        got = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in shapes)
        return f"attend(q, k, v, n) needs q [Mq, D] or [D], k and v [S, D] and an integer n; got {got}"
    return (("f32", q), ("f32", q[:-1]))


def _reference(q, k, v, n):
    """softmax(q k^T / sqrt(D)) v over the first n rows of k, v; returns (o, lse) (empty: 0, -inf)."""
    import torch

    q, k, v = q.float(), k.float(), v.float()
    q2 = q.reshape(-1, q.shape[-1])
    s = q2 @ k.T / math.sqrt(k.shape[-1])
    valid = torch.arange(k.shape[0], device=k.device) < int(n)
    s = s.masked_fill(~valid[None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=1)
    p = torch.where(valid[None, :], torch.exp(s - torch.where(torch.isinf(lse), 0, lse)[:, None]), 0.0)
    o = p @ torch.where(valid[:, None], v, 0.0)
    return o.reshape(q.shape), lse.reshape(q.shape[:-1])


def _emit(em, call, args, results):
    from tilec.ir.types import logical_shape

    q, k, v = (logical_shape(a) for a in call.args[:3])
    mq = q[0] if len(q) == 2 else 1
    scale = 1.0 / (em.extent_of_last(call.args[1]) ** 0.5)  # the true head dim, not the padded tile
    n = em.key_count(call.args[1], args[3])  # clamped to a padded key tile's real rows
    b = em.kb
    return b.assign(b.tup(*results), b.call("td.attend", b.call("tl.reshape", args[0], b.tup(mq, q[-1])),
                                            b.call("tl.reshape", args[1], b.tup(*k)),
                                            b.call("tl.reshape", args[2], b.tup(*v)), n, scale, "INTERPRET"))


ATTEND = TileFn("attend", "attend(q, k, v, n)", 2, _check, _reference, _emit,
                device=("attend", "attend_init", "attend_step", "attend_finish"))
