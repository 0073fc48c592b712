# device call 10 (session 3): re-time the final GEMM code, decode probe (noinline / attend_block / stages),
# taxes --timeline on the GPU, and the first GEMM+RS / GEMM+AR bench rows.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 60 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull --iters 20 --no-tune > $OUT/ag_final.log 2>&1; tail -13 $OUT/ag_final.log
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.json $OUT/ag_final.json 2>/dev/null
timeout 150 python3 benchmarks/decode_probe.py > $OUT/decode_probe2.log 2>&1; tail -12 $OUT/decode_probe2.log
timeout 90 python3 -m tilec taxes examples/ag_gemm.tile --world 1 -D M=8192 -D N=8192 -D K=8192 -D BM=128 -D BN=256 -D BK=64 --num-warps 8 --measure --timeline > $OUT/taxes_timeline.log 2>&1; tail -40 $OUT/taxes_timeline.log
for ex in gemm_rs gemm_ar; do
  timeout 110 python3 -m tilec bench examples/$ex.tile --world 1 --shapes paper,square --iters 10 --no-tune > $OUT/bench_$ex.log 2>&1; tail -30 $OUT/bench_$ex.log
  cp benchmarks/results/h200-1gpu/${ex}_paper+square_bf16.json $OUT/bench_$ex.json 2>/dev/null
  cp benchmarks/results/h200-1gpu/${ex}_paper+square_bf16.png $OUT/bench_$ex.png 2>/dev/null
done
