#!/bin/sh
# One device call on one H200: the residency test under MPS at worlds 2 and 4, then per-task timelines and measured
# times of every AG+GEMM schedule at world 2 under MPS (8192x4608x36864, tilec bench's Hopper tiles), then the GPU
# tests of worlds 2 and 4 under MPS as far as the time allows (TAXES_S, TESTS_S, TESTS4_S: seconds for each). Logs under $1 (default $OUT).
out=${1:-$OUT}
mps=benchmarks/runs/mps_world.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,compute_mode --format=csv > "$out/gpu.txt" 2>&1
for w in 2 4; do
  sh $mps --spawn $w sh -c 'ls -l $CUDA_MPS_PIPE_DIRECTORY; python3 -m pytest -m gpu -q -s -rf -p no:cacheprovider \
    tests/gpu/test_gpu_mps.py --world '$w > "$out/residency_w$w.log" 2>&1
done
timeout ${TAXES_S:-300} sh $mps --spawn 2 python3 -m tilec taxes examples/ag_gemm.tile --world 2 -D M=8192 -D N=4608 -D K=36864 \
  --measure --timeline --trace "$out/ag_gemm_w2_trace.json" > "$out/ag_gemm_w2_taxes.log" 2>&1
echo "rc=$?" >> "$out/ag_gemm_w2_taxes.log"
timeout ${TESTS_S:-150} sh $mps --spawn 2 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu --world 2 \
  > "$out/gpu_tests_w2.log" 2>&1
echo "rc=$?" >> "$out/gpu_tests_w2.log"
if [ "${TESTS4_S:-0}" -gt 0 ]; then
  timeout $TESTS4_S sh $mps --spawn 4 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu --world 4 \
    > "$out/gpu_tests_w4.log" 2>&1
  echo "rc=$?" >> "$out/gpu_tests_w4.log"
fi
