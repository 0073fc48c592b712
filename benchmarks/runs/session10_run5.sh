python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_gpu_examples.py -k "flash or decode" -x > $OUT/gpu_tests_flash.log 2>&1; tail -3 $OUT/gpu_tests_flash.log
A="--world 1 --shapes decode-quick --schedules fused-push --iters 20"
timeout 150 python3 -m tilec bench examples/flash_decode.tile $A --out $OUT/fd_share > $OUT/fd_share.log 2>&1
grep -E "fused-push  |torch sdpa  " $OUT/fd_share.log | grep -v "GB/s" | cut -c1-90
timeout 100 python3 -m tilec taxes examples/flash_decode.tile --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=8192 -D BS=512 --measure --timeline > $OUT/fd_share_8k_timeline.log 2>&1
grep -A6 "^fused-push: call" $OUT/fd_share_8k_timeline.log
