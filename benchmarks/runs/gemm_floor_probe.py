# ruff: noqa: B023 - each closure is timed before the loop moves on
"""Probe: which Triton GEMM form reaches cuBLAS on the shapes where tilec's generated GEMM falls short.

The generated kernels load tiles through pointers in a persistent loop. This times, on one GPU with a reading L2
flush (tilec.perf.gpu_time.cold_time), the same persistent grouped GEMM with (a) pointer loads, (b) TMA tensor
descriptors made on the device, (c) descriptors + warp specialization, for a set of tile configs, against
torch.matmul (cuBLAS). Usage: python benchmarks/runs/gemm_floor_probe.py [M N K ...]
"""

import os
import sys

import torch
import triton
import triton.language as tl

from tilec.perf.gpu_time import cold_time


@triton.jit
def _tile(t, tiles_m, tiles_n, GROUP: tl.constexpr):
    per_group = GROUP * tiles_n
    first = t // per_group * GROUP
    rows = tl.minimum(tiles_m - first, GROUP)
    return first + t % per_group % rows, t % per_group // rows


@triton.jit
def gemm_ptr(A, B, C, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
             GROUP: tl.constexpr, NPROG: tl.constexpr, STAGES: tl.constexpr):
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    for t in range(tl.program_id(0), tiles_m * tiles_n, NPROG):
        pm, pn = _tile(t, tiles_m, tiles_n, GROUP)
        m_r = tl.max_contiguous(tl.multiple_of(pm * BM + tl.arange(0, BM), BM), BM)
        n_r = tl.max_contiguous(tl.multiple_of(pn * BN + tl.arange(0, BN), BN), BN)
        k_r = tl.arange(0, BK)
        a_p = A + m_r[:, None] * K + k_r[None, :]
        b_p = B + k_r[:, None] * N + n_r[None, :]
        acc = tl.zeros((BM, BN), tl.float32)
        for _k in tl.range(0, K, BK, num_stages=STAGES):
            acc = tl.dot(tl.load(a_p), tl.load(b_p), acc)
            a_p += BK
            b_p += BK * N
        tl.store(C + m_r[:, None] * N + n_r[None, :], acc.to(tl.bfloat16))


@triton.jit
def gemm_desc(A, B, C, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              GROUP: tl.constexpr, NPROG: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr,
              STORE_DESC: tl.constexpr = True):
    a_d = tl.make_tensor_descriptor(A, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_d = tl.make_tensor_descriptor(B, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_d = tl.make_tensor_descriptor(C, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    for t in tl.range(tl.program_id(0), tiles_m * tiles_n, NPROG, flatten=True, warp_specialize=WS):
        pm, pn = _tile(t, tiles_m, tiles_n, GROUP)
        acc = tl.zeros((BM, BN), tl.float32)
        for k in tl.range(0, K, BK, num_stages=STAGES):
            acc = tl.dot(a_d.load([pm * BM, k]), b_d.load([k, pn * BN]), acc)
        if STORE_DESC:
            c_d.store([pm * BM, pn * BN], acc.to(tl.bfloat16))
        else:  # a pointer store: no shared-memory staging of the tile, which leaves room for a 4th stage
            m_r = pm * BM + tl.arange(0, BM)
            n_r = pn * BN + tl.arange(0, BN)
            tl.store(C + m_r[:, None] * N + n_r[None, :], acc.to(tl.bfloat16))


@triton.jit
def gemm_streamk(A, B, C, P, F, epoch, M, N, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 GROUP: tl.constexpr, NPROG: tl.constexpr, STAGES: tl.constexpr):
    # Stream-K: the tiles' k-iterations are cut into NPROG equal ranges; a tile split across programs is finished by
    # the program holding its first iterations, which adds the partials the others leave in P (flag F per program).
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BN)
    tiles_m = tl.cdiv(M, BM)
    iters: tl.constexpr = K // BK
    total = tiles_m * tiles_n * iters
    it = pid * total // NPROG
    end = (pid + 1) * total // NPROG
    while it < end:
        t = it // iters
        k0 = it % iters
        k1 = tl.minimum(iters, k0 + end - it)
        pm, pn = _tile(t, tiles_m, tiles_n, GROUP)
        m_r = tl.max_contiguous(tl.multiple_of(pm * BM + tl.arange(0, BM), BM), BM)
        n_r = tl.max_contiguous(tl.multiple_of(pn * BN + tl.arange(0, BN), BN), BN)
        k_r = k0 * BK + tl.arange(0, BK)
        a_p = A + m_r[:, None] * K + k_r[None, :]
        b_p = B + k_r[:, None] * N + n_r[None, :]
        acc = tl.zeros((BM, BN), tl.float32)
        for _k in tl.range(k0, k1, num_stages=STAGES):
            acc = tl.dot(tl.load(a_p), tl.load(b_p), acc)
            a_p += BK
            b_p += BK * N
        r_bm = tl.arange(0, BM)
        r_bn = tl.arange(0, BN)
        if k0 != 0:  # not the tile's first range: leave the partial for the program that owns the tile
            tl.store(P + pid * BM * BN + r_bm[:, None] * BN + r_bn[None, :], acc)
            tl.atomic_xchg(F + pid, epoch, sem="release", scope="gpu")
        else:
            nxt = pid + 1
            covered = k1
            while covered < iters:  # the next programs hold the rest of this tile, in order
                while tl.atomic_add(F + nxt, 0, sem="acquire", scope="gpu") != epoch:
                    pass
                acc += tl.load(P + nxt * BM * BN + r_bm[:, None] * BN + r_bn[None, :])
                covered += (nxt + 1) * total // NPROG - nxt * total // NPROG
                nxt += 1
            tl.store(C + m_r[:, None] * N + n_r[None, :], acc.to(tl.bfloat16))
        it += k1 - k0


CONFIGS = [  # BM, BN, BK, warps, stages (stream-K: gemm_streamk, not timed by default: 0.5-0.6x in its first form)
    (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 256, 64, 8, 5), (64, 256, 64, 4, 4), (64, 256, 64, 8, 4),
    (128, 128, 64, 8, 4), (128, 128, 64, 4, 5),
]


def main(shapes):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ref = a @ b
        cub = cold_time(lambda: torch.matmul(a, b), reps=50) * 1e6
        print(f"{m}x{n}x{k}: cuBLAS {cub:.1f} us", flush=True)
        for bm, bn, bk, w, s in CONFIGS:
            if bn & (bn - 1):
                continue
            tiles = -(-m // bm) * -(-n // bn)
            nprog = min(sms, tiles)
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            p_ws = torch.empty(sms, bm, bn, device="cuda", dtype=torch.float32)
            f_ws = torch.zeros(sms, device="cuda", dtype=torch.int32)
            ep = [0]

            def streamk():
                ep[0] += 1
                gemm_streamk[(sms,)](a, b, c, p_ws, f_ws, ep[0], m, n, k, bm, bn, bk, 8, sms, s, num_warps=w)

            forms = {
                "ptr": lambda: gemm_ptr[(nprog,)](a, b, c, m, n, k, bm, bn, bk, 8, nprog, s, num_warps=w),
                "desc": lambda: gemm_desc[(nprog,)](a, b, c, m, n, k, bm, bn, bk, 8, nprog, s, False, num_warps=w),
                "desc+ws": lambda: gemm_desc[(nprog,)](a, b, c, m, n, k, bm, bn, bk, 8, nprog, s, True, num_warps=w),
                "descld": lambda: gemm_desc[(nprog,)](a, b, c, m, n, k, bm, bn, bk, 8, nprog, s, False, False,
                                                      num_warps=w),
                "descld+ws": lambda: gemm_desc[(nprog,)](a, b, c, m, n, k, bm, bn, bk, 8, nprog, s, True, False,
                                                         num_warps=w),
            }
            if os.environ.get("PROBE_STREAMK"):
                forms["streamk"] = streamk
            for name, fn in forms.items():
                try:
                    c.zero_()
                    fn()
                    torch.cuda.synchronize()
                    err = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                    us = cold_time(fn, reps=50) * 1e6
                    print(f"  {bm}x{bn}x{bk} w{w} s{s} {name:8s} {us:7.1f} us  {cub / us:.3f}x cuBLAS  "
                          f"err {err:.1e}", flush=True)
                except Exception as e:  # a form the compiler refuses for this config
                    print(f"  {bm}x{bn}x{bk} w{w} s{s} {name:8s} failed: {type(e).__name__}: {str(e)[:120]}",
                          flush=True)


if __name__ == "__main__":
    args = [int(x) for x in sys.argv[1:]]
    main([tuple(args[i:i + 3]) for i in range(0, len(args), 3)] or [(1024, 3584, 8192), (8192, 3584, 14336)])
