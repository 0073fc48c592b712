# ruff: noqa: B023 - each closure is timed before the loop moves on
"""Probe: where tilec's generated GEMM loses to the best hand-written Triton form at 1024x3584x8192.

Compiles fused-pull at world 1 (128x256x64 tiles, 8 warps, 4 stages), loads the generated module, and times its
kernel called directly (heap_bases of one rank: peer offsets are 0) as generated and with one source edit at a time,
against cuBLAS and gemm_floor_probe.gemm_ptr, all with a reading L2 flush. Usage: python gemm_gen_probe.py
"""
import importlib.util
import sys
import tempfile

import torch

import tilec
from tilec.perf.gpu_time import cold_time

sys.path.insert(0, "benchmarks/runs")
from gemm_floor_probe import gemm_ptr  # noqa: E402

M, N, K = 1024, 3584, 8192
LOOP = "for k in range(0, 8192, 64):"
A_LOAD = "tl.load(A + peer_idx_rk + idx[:, None] * 8192 + idx_2[None, :])"
EDITS = {
    "as generated": [],
    "no peer offset": [(A_LOAD, "tl.load(A + idx[:, None] * 8192 + idx_2[None, :])")],
    "A rows hinted": [("idx = idx + tl.arange(0, 128)",
                       "idx = tl.max_contiguous(tl.multiple_of(idx + tl.arange(0, 128), 128), 128)")],
    "A by pointer steps": [("        for k in range(", "        a_ptrs = A + peer_idx_rk + idx[:, None] * 8192 + "
                            "tl.arange(0, 64)[None, :]\n        for k in range("),
                           (A_LOAD, "tl.load(a_ptrs)"),
                           ("b_ptrs += 229376", "b_ptrs += 229376\n            a_ptrs += 64")],
    "tl.range stages=4": [(LOOP, "for k in tl.range(0, 8192, 64, num_stages=4):")],
}


def load(src: str, name: str):
    f = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, prefix=name.replace(" ", "_"))
    f.write(src)
    f.close()
    spec = importlib.util.spec_from_file_location(f"gen_{abs(hash(name))}", f.name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    prog = tilec.compile("examples/ag_gemm.tile", 1, "fused-pull", {"M": M, "N": N, "K": K, "BM": 128, "BN": 256,
                         "BK": 64}, retype={"f16": "bf16"}, num_warps=8, num_stages=4, group_m=8)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    ref = a @ b
    cub = cold_time(lambda: torch.matmul(a, b), reps=50) * 1e6
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    us = cold_time(lambda: gemm_ptr[(112,)](a, b, c, M, N, K, 128, 256, 64, 8, 112, 4, num_warps=8), reps=50) * 1e6
    print(f"cuBLAS {cub:.1f} us; gemm_floor_probe ptr s4 {us:.1f} us ({cub / us:.3f}x)", flush=True)
    err = torch.zeros(8, dtype=torch.int32, device="cuda")
    ep = torch.zeros(2, dtype=torch.int32, device="cuda")
    hb = torch.zeros(1, dtype=torch.int64, device="cuda")
    for name, edits in EDITS.items():
        src = prog.source
        for old, new in edits:
            assert old in src, (name, old)
            src = src.replace(old, new)
        k0 = load(src, name).k0_gemm
        for nprog, stages in ((132, 4), (112, 4), (112, 3)):
            c.zero_()
            fn = lambda: k0[(nprog,)](b, a, c, err, hb, 0, 1, 10**10, ep, nprog, False, False, False, num_warps=8,
                                      num_stages=stages)
            fn()
            torch.cuda.synchronize()
            e = ((c.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            t = cold_time(fn, reps=50) * 1e6
            print(f"  {name:20s} grid {nprog} launch stages {stages}: {t:6.1f} us  {cub / t:.3f}x cuBLAS  err {e:.0e}",
                  flush=True)


if __name__ == "__main__":
    main()
