# device call 6: after the _tilec_yield fix. decode-quick + ag_gemm paper benches (every schedule), then GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 150 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --iters 20 --no-tune > $OUT/bench_decode.log 2>&1
tail -32 $OUT/bench_decode.log
cp benchmarks/results/h200-1gpu/flash_decode_decode-quick_bf16.* $OUT/ 2>/dev/null
timeout 150 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --iters 15 --no-tune > $OUT/bench_ag.log 2>&1
tail -30 $OUT/bench_ag.log
mkdir -p $OUT/ag && cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.json $OUT/ag/ag.json && cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.png $OUT/ag/ag.png
timeout 270 python3 -m pytest -m gpu -q -rf tests/gpu > $OUT/gpu_tests.log 2>&1
tail -30 $OUT/gpu_tests.log
