#!/bin/sh
# The cost model's copy-engine terms and `--schedule auto`'s transport pick (issue 19), on two H200s of one host.
# Run from the repository root:
#   sh benchmarks/runs/issue19_model.sh calibrate   tilec calibrate over both GPUs -> benchmarks/results/h200-x2/machine.json
#   sh benchmarks/runs/issue19_model.sh bench       world-2 bench of every variant and the auto row (model's pick with
#                                                   the calibrated machine), then auto vs the best tilec row per shape
set -e
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
M=benchmarks/results/h200-x2/machine.json
OUT=benchmarks/results/h200-x2-auto
case "$1" in
  calibrate)
    mkdir -p benchmarks/results/h200-x2
    python -m tilec calibrate -o $M ;;
  bench)
    export TILEC_MACHINE=$M TILEC_CACHE=$(mktemp -d)  # a fresh auto cache: the auto row is the model's pick
    torchrun --standalone --nproc-per-node 2 -m tilec bench examples/ag_gemm.tile --shapes paper --iters 20 \
      --schedules auto,bsp,flags,flags+dma,fused-push,fused-push+dma,specialized --out $OUT
    python benchmarks/runs/auto_vs_best.py $OUT/*.json ;;
  *) echo "usage: $0 calibrate|bench" >&2; exit 2 ;;
esac
