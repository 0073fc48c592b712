"""Probe: what the split kernel's per-block work costs in streaming rate (after decode_flat_probe.py showed a flat
(task, block) loop gains only 1-3%).

Variants of the split stage's kernel (hand-written from the emitted one; attend init/finish are the generated
module's), S=32K and 64K, B=1, D=128, GQA 8:1, bf16, one program per task slot (2 per SM), copy of K in the same run:
- base: the emitted step (v masked by tl.where before the P.V dot, as a whole-tile attend needs);
- nowhere: v not re-masked (a streamed attend's loads are already masked to 0 past n), so V can feed the dot
  straight from shared memory;
- evict: nowhere, and K/V loads marked evict_first (the cache is read once);
- tma: nowhere, K/V read by TMA (host tensor descriptors over [HKV*S, D]);
- qlate: nowhere, q padded inside the key loop, so a task's first K/V loads need not wait for q.
`--sweep`: the emitted form (nowhere) over the splits default_bs weighs against each other, at 8K-1M.
Run on the device: python benchmarks/decode_stream_probe.py [--sweep] > probe.log
"""

from __future__ import annotations

import math
import sys

import torch
import triton
import triton.language as tl

from benchmarks._split_probe import D, G, Shape, attend_finish, attend_init


@triton.jit
def step(q, k, v, n, m, den, acc, SCALE: tl.constexpr, VWHERE: tl.constexpr):
    S: tl.constexpr = k.shape[0]
    valid = tl.arange(0, S) < n
    if VWHERE:
        v = tl.where(valid[:, None], v, 0.0)
    s = tl.dot(q, tl.trans(k))
    s = tl.where(valid[None, :], s * SCALE, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m - m_safe)
    p = tl.exp(s - m_safe[:, None])
    den = den * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, den, acc


@triton.jit
def split(Q, K, V, Os, Ls, n_len, NTASK, NS: tl.constexpr, BS: tl.constexpr, BLK: tl.constexpr,
          G: tl.constexpr, D: tl.constexpr, S: tl.constexpr, H: tl.constexpr, NPROG: tl.constexpr,
          SCALE: tl.constexpr, VWHERE: tl.constexpr, EVICT: tl.constexpr, TMA: tl.constexpr, QLATE: tl.constexpr):
    pid = tl.program_id(0)
    dr = tl.arange(0, D)
    gr = tl.arange(0, G)
    kr = tl.arange(0, BLK)
    for task in range(pid, NTASK, NPROG):
        j = task % NS
        g = task // NS
        n = n_len - j * BS
        qraw = tl.load(Q + (g * G + gr)[:, None] * D + dr[None, :])
        if QLATE:
            qp, m, den, acc = attend_init(tl.zeros_like(qraw))
        else:
            qp, m, den, acc = attend_init(qraw)
        for c in range(0, BS, BLK):
            if QLATE:
                qp, _m, _d, _a = attend_init(qraw)
            if TMA:
                k = K.load([g * S + j * BS + c, 0])
                v = V.load([g * S + j * BS + c, 0])
            else:
                rows = j * BS + c + kr
                live = (c + kr < n)[:, None]
                if EVICT:
                    k = tl.load(K + g * S * D + rows[:, None] * D + dr[None, :], mask=live, other=0,
                                eviction_policy="evict_first")
                    v = tl.load(V + g * S * D + rows[:, None] * D + dr[None, :], mask=live, other=0,
                                eviction_policy="evict_first")
                else:
                    k = tl.load(K + g * S * D + rows[:, None] * D + dr[None, :], mask=live, other=0)
                    v = tl.load(V + g * S * D + rows[:, None] * D + dr[None, :], mask=live, other=0)
            m, den, acc = step(qp, k, v, n - c, m, den, acc, SCALE, VWHERE)
        o, lse = attend_finish(m, den, acc, G)
        tl.store(Os + j * H * D + (g * G + gr)[:, None] * D + dr[None, :], o)
        tl.store(Ls + j * H + g * G + gr, lse)


VARIANTS = (("base", 1, 0, 0, 4, 0), ("nowhere", 0, 0, 0, 4, 0), ("evict", 0, 1, 0, 4, 0), ("tma", 0, 0, 1, 4, 0),
            ("nowhere w8", 0, 0, 0, 8, 0), ("tma w8", 0, 0, 1, 8, 0), ("qlate", 0, 0, 0, 4, 1))
# (S, HKV, splits): the form emitted now, over the splits default_bs weighs
SWEEP = ((8192, 12, (256, 512, 1024)), (8192, 16, (256, 512, 1024)), (16384, 16, (512, 1024, 2048)),
         (65536, 12, (1024, 2048, 4096)), (65536, 16, (2048, 4096)), (131072, 12, (2048, 4096, 8192)),
         (131072, 16, (4096, 8192)), (1048576, 12, (16384, 32768, 65536)))


def main(sweep: bool):
    from triton.tools.tensor_descriptor import TensorDescriptor

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blk = 64
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs", flush=True)
    plan = SWEEP if sweep else [(s, hkv, (512, 1024, 2048)) for s, hkv in ((32768, 12), (32768, 16), (65536, 12))]
    variants = [v for v in VARIANTS if v[0] == "nowhere"] if sweep else VARIANTS
    for s, hkv, splits in plan:
        sh = Shape(s, hkv)
        kd = TensorDescriptor.from_tensor(sh.k.view(hkv * s, D), block_shape=[blk, D])
        vd = TensorDescriptor.from_tensor(sh.v.view(hkv * s, D), block_shape=[blk, D])
        for bs in splits:
            ns = s // bs
            ntask = hkv * ns
            os_, ls = sh.partials(bs)
            nprog = min(ntask, sms * 2)
            for name, vw, ev, tma, warps, ql in variants:
                kk, vv = (kd, vd) if tma else (sh.k, sh.v)

                def go(sh=sh, s=s, kk=kk, vv=vv, vw=vw, ev=ev, tma=tma, warps=warps, nprog=nprog, bs=bs, ns=ns,
                       ntask=ntask, os_=os_, ls=ls, ql=ql):
                    split[(nprog,)](sh.q, kk, vv, os_, ls, s, ntask, ns, bs, blk, G, D, s, sh.h, nprog,
                                    1 / math.sqrt(D), vw, ev, tma, ql, num_warps=warps, num_stages=3)
                sh.time(f"BS={bs} programs={nprog} {name:10s}", go, os_, ls)
        del sh, kd, vd
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main("--sweep" in sys.argv)
