python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_gpu_ag_gemm.py tests/gpu/test_gpu_dma.py tests/gpu/test_gpu_examples.py tests/gpu/test_gpu_ops.py -k "captured or graph" > $OUT/gpu_tests_capture.log 2>&1
tail -3 $OUT/gpu_tests_capture.log
timeout 280 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --schedules fused-push --iters 20 --out $OUT/flash_decode_quick_leave > $OUT/flash_decode_quick_leave.log 2>&1
tail -12 $OUT/flash_decode_quick_leave.log
