#!/bin/sh
# World-2 benchmarks on two H200s of one host (bf16), one rank per GPU; results in benchmarks/results/h200-x2/.
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for ex in ag_gemm gemm_rs gemm_ar; do
  torchrun --standalone --nproc-per-node 2 -m tilec bench examples/$ex.tile --shapes paper --iters 20
done
for s in decode-paper decode-quick; do
  torchrun --standalone --nproc-per-node 2 -m tilec bench examples/flash_decode.tile --shapes $s \
    --schedules bsp,fused-push --iters 20
done
# the free split count (the fastest decode form at world 1): NS splits per shape fill every SM twice
torchrun --standalone --nproc-per-node 2 -m tilec bench examples/flash_decode_splits.tile --shapes decode-paper \
  --schedules fused-push,specialized --iters 20
