# device call 5 (session 2): streamed tl.dot attend + direct compiled-kernel launches.
# sanity of flash decode on the GPU, decode-quick and ag_gemm paper benches, then the GPU test suite.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
timeout 100 python3 -m pytest -m gpu -q -x tests/gpu/test_gpu_examples.py -k "flash_decode and 1-bf16" 2>&1 | tail -25 > $OUT/gpu_sanity.log
timeout 170 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --iters 20 --no-tune 2>&1 | tee $OUT/bench_decode.log | tail -30
cp benchmarks/results/h200-1gpu/flash_decode_decode-quick_bf16.* $OUT/ 2>/dev/null
timeout 130 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --iters 15 --no-tune 2>&1 | tee $OUT/bench_ag.log | tail -30
cp benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.* $OUT/ 2>/dev/null
timeout 180 python3 -m pytest -m gpu -q tests/gpu 2>&1 | tail -40 > $OUT/gpu_tests.log
tail -5 $OUT/gpu_sanity.log $OUT/gpu_tests.log
