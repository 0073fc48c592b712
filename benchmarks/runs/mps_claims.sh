#!/bin/sh
# One device call on one H200 under MPS: the residency test at worlds 2 and 4, then every AG+GEMM schedule of
# 8192x4608x36864 at world 2 timed (`tilec taxes --measure`, tilec bench's Hopper tiles) with persistent loops that
# claim their tasks (the default under MPS) and, beside it, with the static stride (TILEC_CLAIM=0). Logs under $1.
out=${1:-$OUT}
mps=benchmarks/runs/mps_world.sh
shape="-D M=8192 -D N=4608 -D K=36864"
for w in 2 4; do
  timeout -k 5 60 sh $mps --spawn $w python3 -m pytest -m gpu -q -s -rf -p no:cacheprovider tests/gpu/test_gpu_mps.py \
    --world $w > "$out/residency_w$w.log" 2>&1
done
timeout -k 5 ${TAXES_S:-150} sh $mps --spawn 2 python3 -m tilec taxes examples/ag_gemm.tile --world 2 $shape --measure \
  > "$out/ag_gemm_w2_claims.log" 2>&1
echo "rc=$?" >> "$out/ag_gemm_w2_claims.log"
