"""Host side of examples/moe.tile: the routing tables a mixture-of-experts call takes, from top-k expert ids, and
the torch reference of the layer.

Experts are numbered globally, expert e on rank e // EL as its local expert e % EL. Every (sending rank r, expert)
pair has C slots on the expert's owner, filled in token order then choice order; a choice past its expert's C
slots is dropped (weight 0). `route` gives each rank's inputs: as an owner, `src` (the sending rank's token row
of every slot, 0 where unused), `cnt` (used slots per (r, expert)) and `dend` (where each block of the dispatch's
copy stops); as a sender, `slot` (the row of its Yb that returns choice k of token t: owner*EL*C + el*C + c, laid
out k-major), `wt` (the choice's weight) and `bend` (where each block of the return's copy stops).
"""

from __future__ import annotations

import torch


def route(ids: list[torch.Tensor], weights: list[torch.Tensor], experts_per_rank: int, capacity: int,
          block: int = 16) -> list[dict[str, torch.Tensor]]:
    """ids[r], weights[r]: rank r's [T, K] top-k expert ids and weights. Returns every rank's src, cnt, slot, wt and
    the per-block ends of the copies (`block`: the program's BC): dend (owner side, the rows of Xd) and bend (sender
    side, the rows of Yb)."""
    world, el_n, cap = len(ids), experts_per_rank, capacity
    t_n, k_n = ids[0].shape
    src = [torch.zeros(world * el_n * cap, dtype=torch.int32) for _ in range(world)]
    cnt = [torch.zeros(world * el_n, dtype=torch.int32) for _ in range(world)]
    out = []
    for r in range(world):
        slot = torch.zeros(k_n * t_n, dtype=torch.int32)
        wt = torch.zeros(t_n, k_n, dtype=torch.float32)
        for t in range(t_n):
            for k in range(k_n):
                e = int(ids[r][t, k])
                if not 0 <= e < world * el_n:
                    raise ValueError(f"expert id {e} of token {t} on rank {r} is not one of {world * el_n} experts")
                o, el = divmod(e, el_n)
                c = int(cnt[o][r * el_n + el])
                if c >= cap:
                    continue  # over capacity: dropped
                src[o][(r * el_n + el) * cap + c] = t
                cnt[o][r * el_n + el] = c + 1
                slot[k * t_n + t] = (o * el_n + el) * cap + c
                wt[t, k] = float(weights[r][t, k])
        out.append({"slot": slot, "wt": wt})
    span = el_n * cap
    dend, bend = [], []
    for me in range(world):
        # row s of peer p's segment is used iff its slot is: dispatch (me owns it) / back (me sent it)
        used_d = [[int(cnt[me][p * el_n + s // cap]) > s % cap for s in range(span)] for p in range(world)]
        used_b = [[int(cnt[p][me * el_n + s // cap]) > s % cap for s in range(span)] for p in range(world)]
        dend.append(_ends(used_d, block))
        bend.append(_ends(used_b, block))
    return [{"src": src[r], "cnt": cnt[r], **out[r], "dend": dend[r], "bend": bend[r]} for r in range(world)]


def _ends(used: list[list[bool]], block: int) -> torch.Tensor:
    """Per row s of each peer's segment: one past the last used row of s's block (its first row where none is), the
    count a copy of the block's rows stops at (unused rows before it are copied too: they name row 0)."""
    out = []
    for seg in used:
        span = len(seg)
        for s in range(span):
            b = s - s % block
            last = [i for i in range(b, min(b + block, span)) if seg[i]]
            out.append(last[-1] + 1 if last else b)
    return torch.tensor(out, dtype=torch.int32)


def reference(x: list[torch.Tensor], w1: list[torch.Tensor], w3: list[torch.Tensor], w2: list[torch.Tensor],
              ids: list[torch.Tensor], weights: list[torch.Tensor], experts_per_rank: int, capacity: int
              ) -> list[torch.Tensor]:
    """Every rank's output of the layer, in f32, with the same capacity rule as `route`: w1[o], w3[o] are rank o's
    [EL*H, F] weights, w2[o] its [EL*F, H]; the SwiGLU product is rounded to x's dtype before W2, as the kernel
    does."""
    world, el_n = len(x), experts_per_rank
    h, f = x[0].shape[1], w1[0].shape[1]
    used = [[0] * (world * el_n) for _ in range(world)]
    outs = []
    for r in range(world):
        o_r = torch.zeros(x[r].shape, dtype=torch.float32)
        for t in range(x[r].shape[0]):
            for k in range(ids[r].shape[1]):
                e = int(ids[r][t, k])
                o, el = divmod(e, el_n)
                if used[r][e] >= capacity:
                    continue
                used[r][e] += 1
                xt = x[r][t].float()
                a = xt @ w1[o][el * h:(el + 1) * h].float()
                b = xt @ w3[o][el * h:(el + 1) * h].float()
                y = (torch.nn.functional.silu(a) * b).to(x[r].dtype).float() @ w2[o][el * f:(el + 1) * f].float()
                o_r[t] += float(weights[r][t, k]) * y.to(x[r].dtype).float()
        outs.append(o_r)
    return outs
