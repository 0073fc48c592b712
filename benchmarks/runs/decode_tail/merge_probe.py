"""How fast one program merges NP softmax partials of M heads x D (f32, in L2), by code form: flash decode's local
merge (NP=16 splits, M=8 query heads of a KV head, D=128). Each of P programs merges R different partial sets one
after another (R x P x NP x M x D x 4 bytes, L2-resident after a warm-up); prints us per merge.
The two-pass forms (the chunked ones and rows2d) were tried as tilec's lse_merge and dropped: one
program's loads of a chunk wait for the previous chunk, so every form but the one-shot is slower (merge_probe.log).
Usage: python benchmarks/runs/decode_tail/merge_probe.py"""
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import tilec.device as td

NP, M, D, P, R = 16, 8, 128, 16, 16


@triton.jit
def merge_weights(lse, N):
    # pass 1 over lse [NP, M] (rows >= N padding): each row's max (0 when all empty) and sum_i exp(lse_i - max)
    NP: tl.constexpr = lse.shape[0]
    lse = tl.where((tl.arange(0, NP) < N)[:, None], lse.to(tl.float32), float("-inf"))
    big = tl.max(lse, axis=0)
    big = tl.where(big == float("-inf"), 0.0, big)
    return big, tl.sum(tl.exp(lse - big[None, :]), axis=0)


@triton.jit
def merge_add(o, lse, N, big, acc):
    # pass 2, one chunk o [C, M, D], lse [C, M]: acc += sum_i exp(lse_i - big) o_i
    C: tl.constexpr = lse.shape[0]
    lse = tl.where((tl.arange(0, C) < N)[:, None], lse.to(tl.float32), float("-inf"))
    return acc + tl.sum(tl.exp(lse - big[None, :])[:, :, None] * o.to(tl.float32), axis=0)


@triton.jit
def merge_finish(big, den, acc):
    out = acc / tl.where(den == 0.0, 1.0, den)[:, None]
    return out, tl.where(den == 0.0, float("-inf"), big + tl.log(tl.where(den == 0.0, 1.0, den)))


@triton.jit
def one_shot(Os, Ls, Out, R: tl.constexpr, NP: tl.constexpr, M: tl.constexpr, D: tl.constexpr):
    pid = tl.program_id(0)
    n, m, d = tl.arange(0, NP), tl.arange(0, M), tl.arange(0, D)
    for r in range(R):
        base = (pid * R + r) * NP * M
        o = tl.load(Os + (base + n[:, None, None] * M + m[None, :, None]) * D + d[None, None, :])
        lse = tl.load(Ls + base + n[:, None] * M + m[None, :])
        out, _ = td.lse_merge(o, lse, NP)
        tl.store(Out + ((pid * R + r) * M + m[:, None]) * D + d[None, :], out)


@triton.jit
def chunked(Os, Ls, Out, R: tl.constexpr, NP: tl.constexpr, M: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
            STATIC: tl.constexpr):
    pid = tl.program_id(0)
    n, m, d, c = tl.arange(0, NP), tl.arange(0, M), tl.arange(0, D), tl.arange(0, C)
    for r in range(R):
        base = (pid * R + r) * NP * M
        big, den = merge_weights(tl.load(Ls + base + n[:, None] * M + m[None, :]), NP)
        acc = tl.zeros((M, D), dtype=tl.float32)
        if STATIC:
            for i in tl.static_range(0, NP, C):
                o = tl.load(Os + (base + (i + c)[:, None, None] * M + m[None, :, None]) * D + d[None, None, :])
                lse = tl.load(Ls + base + (i + c)[:, None] * M + m[None, :])
                acc = merge_add(o, lse, NP - i, big, acc)
        else:
            for i in range(0, NP, C):
                o = tl.load(Os + (base + (i + c)[:, None, None] * M + m[None, :, None]) * D + d[None, None, :])
                lse = tl.load(Ls + base + (i + c)[:, None] * M + m[None, :])
                acc = merge_add(o, lse, NP - i, big, acc)
        out, _ = merge_finish(big, den, acc)
        tl.store(Out + ((pid * R + r) * M + m[:, None]) * D + d[None, :], out)


@triton.jit
def rows2d(Os, Ls, Out, R: tl.constexpr, NP: tl.constexpr, M: tl.constexpr, D: tl.constexpr, STATIC: tl.constexpr):
    # one partial at a time as [M, D] with weights [M]: no 3-D tile, no reduction over partials in registers
    pid = tl.program_id(0)
    n, m, d = tl.arange(0, NP), tl.arange(0, M), tl.arange(0, D)
    for r in range(R):
        base = (pid * R + r) * NP * M
        big, den = merge_weights(tl.load(Ls + base + n[:, None] * M + m[None, :]), NP)
        acc = tl.zeros((M, D), dtype=tl.float32)
        if STATIC:
            for i in tl.static_range(NP):
                o = tl.load(Os + (base + i * M + m[:, None]) * D + d[None, :])
                w = tl.exp(tl.load(Ls + base + i * M + m) - big)
                acc += w[:, None] * o
        else:
            for i in range(NP):
                o = tl.load(Os + (base + i * M + m[:, None]) * D + d[None, :])
                w = tl.exp(tl.load(Ls + base + i * M + m) - big)
                acc += w[:, None] * o
        out, _ = merge_finish(big, den, acc)
        tl.store(Out + ((pid * R + r) * M + m[:, None]) * D + d[None, :], out)


def main():
    torch.manual_seed(0)
    os_ = torch.randn(P * R * NP * M * D, device="cuda")
    ls = torch.randn(P * R * NP * M, device="cuda")
    ref = torch.empty(P * R * M * D, device="cuda")
    one_shot[(P,)](os_, ls, ref, R, NP, M, D, num_warps=4)
    rows = []
    cases = [("one-shot [16,8,128]",
              lambda o, w, s: one_shot[(P,)](os_, ls, o, R, NP, M, D, num_warps=w, num_stages=s))]
    for c in (1, 2, 4):
        for st in (True, False):
            cases.append((f"chunked C={c} {'static' if st else 'loop'}",
                          lambda o, w, s, c=c, st=st: chunked[(P,)](os_, ls, o, R, NP, M, D, c, st, num_warps=w,
                                                                   num_stages=s)))
    for st in (True, False):
        cases.append((f"rows2d {'static' if st else 'loop'}",
                      lambda o, w, s, st=st: rows2d[(P,)](os_, ls, o, R, NP, M, D, st, num_warps=w, num_stages=s)))
    for name, fn in cases:
        for w, s in ((4, 1), (4, 3), (8, 1)):
            out = torch.empty_like(ref)
            fn(out, w, s)
            err = (out - ref).abs().max().item()
            t = do_bench(lambda out=out, fn=fn, w=w, s=s: fn(out, w, s), warmup=20, rep=100)
            rows.append(f"{name:28s} w{w} s{s}: {t * 1e3 / R:6.2f} us per merge (kernel {t * 1e3:6.1f} us)"
                        f" err {err:.1e}")
            print(rows[-1], flush=True)


if __name__ == "__main__":
    main()
