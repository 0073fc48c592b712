#!/bin/sh
# Why `tilec bench` times every row of a shape in two rounds of opposite order, one H200, world 1, bf16. Results:
# benchmarks/results/h200-1gpu/bench_rounds/. Run from the repository root: sh benchmarks/runs/bench_rounds.sh PART
#   order    what ran just before a timing changes it (order_probe.py)
#   gemm     the GEMM bench's two rounds: the small shapes, and fused-pull / fused-push on the paper shapes
set -e
out=${OUT:-benchmarks/results/h200-1gpu/bench_rounds}
mkdir -p "$out"
case "$1" in
  order) python benchmarks/runs/order_probe.py > "$out/order_probe.log" 2>&1 ;;
  gemm)
    python -m tilec bench examples/ag_gemm.tile --world 1 --shapes small --iters 10 --out "$out/small" \
      > "$out/gemm_small.log" 2>&1
    python -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules fused-pull,fused-push --iters 20 \
      --out "$out/paper" > "$out/ag_gemm_paper.log" 2>&1 ;;
  *) echo "usage: $0 order|gemm" >&2; exit 2 ;;
esac
