#!/bin/sh
# transport=dma (issue 19): copy stages on the copy engines. Run from the repository root.
#   sh benchmarks/runs/dma_h200.sh check   one H200: GPU tests (worlds 1, 2, 4 share the GPU) + a 4-rank run
#   sh benchmarks/runs/dma_h200.sh w1      one H200: world-1 bench, sm vs dma (benchmarks/results/h200-1gpu-dma/)
#   sh benchmarks/runs/dma_h200.sh w2      two H200s: world-2 bench, sm vs dma (benchmarks/results/h200-x2-dma/)
# --no-tune: the first tile config for sm and dma alike (an A/B of the transport); drop it to tune each row.
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S=flags,flags+dma,fused-push,fused-push+dma
case "$1" in
  check)
    python -m pytest -m gpu -q -rf tests/gpu/test_gpu_dma.py
    python -m tilec run examples/ag_gemm.tile -w 4 -s flags --transport dma --backend iris -D M=4096 -D N=1024 -D K=512
    python -m tilec run examples/ag_gemm.tile -w 2 -s fused-push --transport dma --backend iris -D M=1000 -D N=200 \
      -D K=136 ;;
  w1)
    python -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules $S --iters 20 --no-tune \
      --out benchmarks/results/h200-1gpu-dma ;;
  w2)
    torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper --schedules $S \
      --iters 20 --no-tune --out benchmarks/results/h200-x2-dma ;;
  *) echo "usage: $0 check|w1|w2" >&2; exit 2 ;;
esac
