# device call 11 (session 3): remote stores through one peer offset per task instead of iris.store's per-element
# translation, and grouped tile order under rank loops (gemm_rs / gemm_ar). Re-times what that touches, and
# probes the decode KV layout / split order.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 90 python3 -m tilec taxes examples/ag_gemm.tile --world 1 -D M=8192 -D N=8192 -D K=8192 -D BM=128 -D BN=256 -D BK=64 --num-warps 8 --measure --timeline > $OUT/taxes_timeline2.txt 2>&1; tail -34 $OUT/taxes_timeline2.txt
for ex in gemm_rs gemm_ar; do
  timeout 110 python3 -m tilec bench examples/$ex.tile --world 1 --shapes paper,square --iters 10 --no-tune > $OUT/bench_$ex.txt 2>&1; tail -30 $OUT/bench_$ex.txt
  cp benchmarks/results/h200-1gpu/${ex}_paper+square_bf16.json $OUT/bench_$ex.json 2>/dev/null
  cp benchmarks/results/h200-1gpu/${ex}_paper+square_bf16.png $OUT/bench_$ex.png 2>/dev/null
done
timeout 150 python3 benchmarks/decode_layout_probe.py > $OUT/decode_layout.txt 2>&1; cat $OUT/decode_layout.txt | tail -30
timeout 80 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull,fused-push --iters 15 --no-tune > $OUT/ag_push.txt 2>&1; tail -19 $OUT/ag_push.txt
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.json $OUT/ag_push.json 2>/dev/null
