# ruff: noqa: B023 - each closure is timed before the loop moves on
"""Probe: how fast can flash decode's split stage stream the KV cache on one GPU, by load form?

The generated split task loads 64-key blocks of K and V through masked pointer loads (tilec.device.attend_*). This
times the split stage alone (one program per (head, split), as bsp's split kernel) with: `ptr` (as generated),
`ptr-nomask` (mask only where the split runs past the sequence), `desc` (TMA tensor descriptors whose shape ends at
the valid length, so the copy engine of the SM zero-fills), against torch SDPA (enable_gqa) on the same shape and a
plain read of the cache (K.sum + V.sum), all after a reading L2 flush.
Usage: python benchmarks/runs/decode_configs/decode_stream_probe.py
"""

import torch
import triton
import triton.language as tl

import tilec.device as td
from tilec.perf.gpu_time import cold_time


@triton.jit
def split_kernel(Q, K, V, Os, Ls, n_valid, S, SPLITS, BS: tl.constexpr, BLK: tl.constexpr, G: tl.constexpr,
                 D: tl.constexpr, FORM: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    j = pid % SPLITS
    g = pid // SPLITS  # b * HKV + kv head
    q_r = tl.arange(0, G)
    d_r = tl.arange(0, D)
    q = tl.load(Q + (g * G + q_r)[:, None] * D + d_r[None, :])
    n = n_valid - j * BS
    qp, m, den, acc = td.attend_init(q)
    base = g.to(tl.int64) * S * D
    if FORM == 2:
        kd = tl.make_tensor_descriptor(K + base, shape=[n_valid, D], strides=[D, 1], block_shape=[BLK, D])
        vd = tl.make_tensor_descriptor(V + base, shape=[n_valid, D], strides=[D, 1], block_shape=[BLK, D])
        for kb in tl.range(0, BS, BLK, num_stages=STAGES):
            k = kd.load([j * BS + kb, 0])
            v = vd.load([j * BS + kb, 0])
            m, den, acc = td.attend_step(qp, k, v, n - kb, m, den, acc, 0.0883883, False, True)
    else:
        for kb in tl.range(0, BS, BLK, num_stages=STAGES):
            rows = j * BS + kb + tl.arange(0, BLK)
            ok = (kb + tl.arange(0, BLK)) < n
            if FORM == 0:
                k = tl.load(K + base + rows[:, None] * D + d_r[None, :], mask=ok[:, None], other=0)
                v = tl.load(V + base + rows[:, None] * D + d_r[None, :], mask=ok[:, None], other=0)
            else:
                k = tl.load(K + base + rows[:, None] * D + d_r[None, :])
                v = tl.load(V + base + rows[:, None] * D + d_r[None, :])
            m, den, acc = td.attend_step(qp, k, v, n - kb, m, den, acc, 0.0883883, False, True)
    o, lse = td.attend_finish(m, den, acc, G)
    tl.store(Os + ((j * tl.num_programs(0) // SPLITS + g) * G + q_r)[:, None] * D + d_r[None, :], o)
    tl.store(Ls + (j * tl.num_programs(0) // SPLITS + g) * G + q_r, lse)


def main():
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    shapes = [(1, 16, 8, 128, 8192), (1, 12, 8, 128, 65536), (8, 16, 8, 128, 16384)]
    for b, hkv, g, d, s in shapes:
        q = torch.randn(b, hkv * g, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        gb = 2 * k.numel() * 2 / 1e9
        sd = cold_time(lambda: torch.nn.functional.scaled_dot_product_attention(
            q[:, :, None], k, v, enable_gqa=True), reps=50) * 1e6
        rd = cold_time(lambda: (k.sum(), v.sum()), reps=50) * 1e6
        print(f"B{b} H{hkv * g} S{s}: {gb * 1e3:.0f} MB; sdpa {sd:.1f} us ({gb / sd * 1e6:.0f} GB/s); "
              f"read {rd:.1f} us ({gb / rd * 1e6:.0f} GB/s)", flush=True)
        for bs in (512, 1024, 2048, 4096):
            splits = s // bs
            if b * hkv * splits > 1024 or splits < 1:
                continue
            os_ = torch.empty(splits * b * hkv * g, d, device="cuda", dtype=torch.float32)
            ls = torch.empty(splits * b * hkv * g, device="cuda", dtype=torch.float32)
            for form, fname in ((0, "ptr"), (1, "ptr-nomask"), (2, "desc")):
                for blk, w, st in ((64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 3), (64, 8, 4)):
                    try:
                        fn = lambda: split_kernel[(b * hkv * splits,)](  # noqa: E731
                            q, k, v, os_, ls, s, s, splits, bs, blk, g, d, form, st, num_warps=w)
                        fn()
                        torch.cuda.synchronize()
                        us = cold_time(fn, reps=50) * 1e6
                        print(f"  BS {bs:5d} {fname:10s} blk {blk:3d} w{w} s{st}: {us:7.1f} us "
                              f"{gb / us * 1e6:6.0f} GB/s  ({sd / us:.2f}x sdpa)", flush=True)
                    except Exception as e:
                        print(f"  BS {bs} {fname} blk {blk} w{w} s{st}: failed {type(e).__name__}: {str(e)[:100]}")


if __name__ == "__main__":
    main()
