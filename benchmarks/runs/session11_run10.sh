python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 200 python3 -m tilec bench examples/flash_decode_splits.tile --world 1 --shapes decode-quick --schedules fused-push --iters 20 --out $OUT/fd_splits_quick > $OUT/fd_splits_quick.log 2>&1
grep -E "second round|^\[" $OUT/fd_splits_quick.log | cut -c1-240
