# device call 4: flash decode + GEMM-RS/AR on the GPU (2 ranks), then the decode-quick bench (world 1)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 120 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --iters 20 --no-tune 2>&1 | tee $OUT/bench_decode.log
cp benchmarks/results/h200-1gpu/flash_decode_decode-quick_bf16.* $OUT/
timeout 90 python3 -m pytest -m gpu -q -x tests/gpu/test_gpu_examples.py 2>&1 | tail -8 | tee $OUT/gpu_examples.log
