"""Probe: does one flat loop over (task, key block) stream the KV cache faster than a task loop around a block loop?

The split stage of examples/flash_decode.tile runs as a persistent loop over tasks, each a loop over blocks of keys.
Every task restarts Triton's software pipeline: its first block's loads are issued only when the previous task has
finished (~64 keys' worth per task, fitted in session 4). A flat loop over (task, block) pairs lets the pipeliner
issue the next task's first blocks while the current one finishes, so small splits (fine load balance over the
resident programs) cost no ramp. This times both forms of the same split kernel, hand-written from the emitted one
(its attend helpers are the generated module's), for B=1, D=128, GQA 8:1, bf16 at S=32K/64K, beside a copy of K in
the same run, and checks the flat form's partials against torch. Run on the device:
python benchmarks/decode_flat_probe.py > probe.log
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from benchmarks._split_probe import D, G, Shape, attend_finish, attend_init, attend_step
from benchmarks.decode_stream_probe import split


@triton.jit
def split_flat(Q, K, V, Os, Ls, n_len, NTASK, NS: tl.constexpr, BS: tl.constexpr, BLK: tl.constexpr,
               G: tl.constexpr, D: tl.constexpr, S: tl.constexpr, H: tl.constexpr, NPROG: tl.constexpr,
               SCALE: tl.constexpr):
    pid = tl.program_id(0)
    NB: tl.constexpr = BS // BLK
    dr = tl.arange(0, D)
    gr = tl.arange(0, G)
    kr = tl.arange(0, BLK)
    mine = (NTASK - pid + NPROG - 1) // NPROG
    qp, m, den, acc = attend_init(tl.zeros((G, D), dtype=Q.dtype.element_ty))
    for it in range(0, mine * NB):
        i = it // NB
        c = (it - i * NB) * BLK
        task = pid + i * NPROG
        j = task % NS
        g = task // NS
        n = n_len - j * BS
        if c == 0:
            qp, m, den, acc = attend_init(tl.load(Q + (g * G + gr)[:, None] * D + dr[None, :]))
        rows = j * BS + c + kr
        live = (c + kr < n)[:, None]
        k = tl.load(K + g * S * D + rows[:, None] * D + dr[None, :], mask=live, other=0)
        v = tl.load(V + g * S * D + rows[:, None] * D + dr[None, :], mask=live, other=0)
        m, den, acc = attend_step(qp, k, v, n - c, m, den, acc, SCALE, False, False)
        if c == (NB - 1) * BLK:
            o, lse = attend_finish(m, den, acc, G)
            tl.store(Os + j * H * D + (g * G + gr)[:, None] * D + dr[None, :], o)
            tl.store(Ls + j * H + g * G + gr, lse)


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device: {torch.cuda.get_device_name(0)}, {sms} SMs", flush=True)
    for s in (32768, 65536):
        for hkv in (12, 16):
            sh = Shape(s, hkv)
            for bs in (256, 512, 1024, 2048):
                ns = s // bs
                ntask = hkv * ns
                os_, ls = sh.partials(bs)
                for per_sm in (2, 3):
                    nprog = min(ntask, sms * per_sm)
                    for name in ("nested", "flat"):
                        def go(sh=sh, s=s, name=name, nprog=nprog, bs=bs, ns=ns, ntask=ntask, os_=os_, ls=ls):
                            args = (sh.q, sh.k, sh.v, os_, ls, s, ntask, ns, bs, 64, G, D, s, sh.h, nprog,
                                    1 / math.sqrt(D))
                            if name == "flat":
                                split_flat[(nprog,)](*args, num_warps=4, num_stages=3)
                            else:  # the emitted form of the time (v re-masked)
                                split[(nprog,)](*args, 1, 0, 0, 0, num_warps=4, num_stages=3)
                        sh.time(f"BS={bs} programs={nprog} ({per_sm}/SM) {name:6s}", go, os_, ls)
            del sh
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
