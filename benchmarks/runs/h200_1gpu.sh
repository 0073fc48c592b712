#!/bin/sh
# World-1 benchmarks on one H200 (bf16); results land in benchmarks/results/h200-1gpu/. Usage: h200_1gpu.sh [gemm|decode]
set -e
what=${1:-all}
if [ "$what" = gemm ] || [ "$what" = all ]; then
  for ex in ag_gemm gemm_rs gemm_ar; do
    tilec bench examples/$ex.tile --world 1 --shapes paper --iters 20
  done
fi
if [ "$what" = decode ] || [ "$what" = all ]; then
  for s in decode-paper decode-quick; do
    tilec bench examples/flash_decode.tile --world 1 --shapes $s --schedules bsp,fused-push --iters 20
  done
fi
