python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
for ns in 200 0; do
  TILEC_WAIT_SLEEP_NS=$ns timeout 100 python3 -m tilec bench examples/flash_decode_splits.tile --world 1 --shapes decode-quick --schedules fused-push --iters 20 --out $OUT/sleep$ns > $OUT/fd_splits_quick_sleep$ns.log 2>&1
  echo "== TILEC_WAIT_SLEEP_NS=$ns"; grep -E "second round" $OUT/fd_splits_quick_sleep$ns.log | cut -c1-220
done
