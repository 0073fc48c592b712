#!/bin/sh
# local-in-place and the overlapped fused-push: All-Gather + GEMM, bf16, the paper shapes, on one H200 (the copy is
# gone: flags and fused-push are the GEMM alone) and on two (the copy moves only the peer's rows, interleaved with
# the GEMM tiles over this rank's rows). Results: benchmarks/results/h200-1gpu/local_in_place/ (w1);
# benchmarks/results/h200-x2/local_in_place/ (w2, not yet run). Run from the repository root:
#   sh benchmarks/runs/local_in_place.sh w1 | w2
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$1" in
  w1)
    out=${OUT:-benchmarks/results/h200-1gpu/local_in_place}
    python -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules flags,fused-push \
      --iters 20 --no-tune --out "$out" ;;
  w2)
    out=${OUT:-benchmarks/results/h200-x2/local_in_place}
    torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper \
      --schedules bsp,flags,fused-push,specialized,fused-pull --iters 20 --no-tune --out "$out"
    # where the time goes inside the kernel: the copies should overlap the GEMM tiles over this rank's rows
    torchrun --standalone --nproc-per-node 2 -m tilec taxes examples/ag_gemm.tile -D M=8192 -D N=4608 -D K=36864 \
      -D BM=128 -D BN=256 -D BK=64 --num-warps 8 --measure --timeline --trace "$out/w2_timeline.json" ;;
  *) echo "usage: $0 w1|w2" >&2; exit 2 ;;
esac
