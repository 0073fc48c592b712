#!/bin/sh
# The generated GEMM against cuBLAS (the floor of the GEMM family at world 1), one H200, bf16. Results:
# benchmarks/results/h200-1gpu/gemm_floor/. Run from the repository root: sh benchmarks/runs/gemm_floor.sh PART
#   tuned    the paper shapes, fused-pull, tile configs tuned afresh by device time
#   forms    hand-written Triton GEMM forms vs cuBLAS (gemm_floor_probe.py) at 1024x3584x8192 and 8192x3584x14336
#   kernel   the generated kernel called directly, one source edit at a time (gemm_gen_probe.py)
#   epoch    a CUDA graph's separate epoch bump before a kernel (epoch_probe.py)
set -e
out=${OUT:-benchmarks/results/h200-1gpu/gemm_floor}
mkdir -p "$out"
case "$1" in
  tuned)
    TILEC_CACHE=$(mktemp -d) python -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper \
      --schedules fused-pull --iters 20 --out "$out/pull_tuned" > "$out/ag_gemm_pull_tuned.log" 2>&1 ;;
  forms)
    python benchmarks/runs/gemm_floor_probe.py 1024 3584 8192 > "$out/gemm_floor_probe_1.log" 2>&1
    python benchmarks/runs/gemm_floor_probe.py 1024 3584 8192 8192 3584 14336 > "$out/gemm_floor_probe_3.log" 2>&1 ;;
  kernel) python benchmarks/runs/gemm_gen_probe.py > "$out/gemm_gen_probe.log" 2>&1 ;;
  epoch) python benchmarks/runs/epoch_probe.py > "$out/epoch_probe.log" 2>&1 ;;
  *) echo "usage: $0 tuned|forms|kernel|epoch" >&2; exit 2 ;;
esac
