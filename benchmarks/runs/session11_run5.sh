python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 150 python3 -m pytest -q -m gpu tests/gpu/test_gpu_examples.py -k "free_splits" -x > $OUT/gpu_tests_splits.log 2>&1; tail -3 $OUT/gpu_tests_splits.log
timeout 420 python3 -m tilec bench examples/flash_decode_splits.tile --world 1 --shapes decode-paper --schedules fused-push --iters 10 --out $OUT/fd_splits_paper > $OUT/fd_splits_paper.log 2>&1
grep -E "^\[|second round" $OUT/fd_splits_paper.log | cut -c1-200
