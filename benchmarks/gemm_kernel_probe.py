"""Kernel-only timing of tilec's generated GEMM (world 1) vs torch.matmul, with triton.testing.do_bench.

Separates the generated kernel's speed from call overheads (barriers, Python) in `tilec bench`.
Usage (GPU): python benchmarks/gemm_kernel_probe.py
"""

import torch
from triton.testing import do_bench

import tilec
from tilec.runtime import IrisHeap, from_env, launch
from tilec.runtime.launch import LaunchContext

SHAPES = [(8192, 8192, 8192), (8192, 4608, 36864), (1024, 3584, 8192)]
CFGS = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4)]

if __name__ == "__main__":
    heap: IrisHeap = from_env("iris", 6 << 30)
    for m, n, k in SHAPES:
        a = heap.alloc((m, k), torch.bfloat16)
        b = heap.alloc((k, n), torch.bfloat16)
        c = heap.alloc((m, n), torch.bfloat16)
        a.normal_()
        b.normal_()
        t_ref = do_bench(lambda a=a, b=b: torch.matmul(a, b), warmup=25, rep=100)
        ref = (a.float() @ b.float())
        for sched in ("bsp", "fused-pull"):
            for bm, bn, bk, w, s in CFGS:
                prog = tilec.compile("examples/ag_gemm.tile", world=1, schedule=sched, retype={"f16": "bf16"},
                                     num_warps=w, num_stages=s, dims={"M": m, "N": n, "K": k, "BM": bm, "BN": bn,
                                                                       "BK": bk})
                prog(heap, A=a, B=b, C=c)
                err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
                mod, st = prog.module, prog._state[id(heap)]
                ctx: LaunchContext = st["ctx"]
                bufs = {**st["bufs"], "A": a, "B": b, "C": c}
                kern, total, persistent, _c, _b, share, groups, _p = mod.KERNELS[-1]
                nprog = ctx.grid(total, persistent, share, groups)
                args = launch.kernel_args(ctx, bufs, 1, mod.KERNELS[-1], nprog)
                t = do_bench(lambda kern=kern, args=args, nprog=nprog, w=w, s=s: kern[(nprog,)](
                    *args, UPCAST_DOT=False, num_warps=w, num_stages=s), warmup=25, rep=100)
                tf = 2 * m * n * k / t / 1e9
                print(f"{m}x{n}x{k} {sched:<10} {(bm, bn, bk, w, s)} gemm kernel {t * 1e3:8.1f}us {tf:6.0f} TFLOP/s"
                      f"  = {t_ref / t:.3f}x torch.matmul ({t_ref * 1e3:.1f}us)  err {err:.1e}", flush=True)
        heap.release(0)
