#!/bin/sh
# Issue 19, local-in-place and the overlapped fused-push (branch h-local): All-Gather + GEMM, bf16, the paper
# shapes, on one H200 (the copy is gone: flags and fused-push are the GEMM alone) and on two (the copy moves only
# the peer's rows, interleaved with the GEMM tiles over this rank's rows). Compare with the committed
# benchmarks/results/h200-1gpu/ag_gemm_paper_bf16.* and h200-x2/ag_gemm_paper_bf16.* (made before the change).
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-benchmarks/results/issue19_local}
python -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules bsp,flags,fused-push \
  --iters 20 --no-tune --out "$out/w1"
torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper \
  --schedules bsp,flags,fused-push,specialized,fused-pull --iters 20 --no-tune --out "$out/w2"
# where the time goes inside the kernel: the copies should now overlap the GEMM tiles over this rank's rows
torchrun --standalone --nproc-per-node 2 -m tilec taxes examples/ag_gemm.tile -D M=8192 -D N=4608 -D K=36864 \
  -D BM=128 -D BN=256 -D BK=64 --num-warps 8 --measure --timeline --trace "$out/w2_timeline.json"
