python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -rf tests/gpu/test_gpu_dma.py > $OUT/gpu_tests_dma.log 2>&1; tail -2 $OUT/gpu_tests_dma.log
for f in 1 0; do for ns in 0 200 1000; do
  TILEC_FOLD=$f TILEC_WAIT_SLEEP_NS=$ns timeout 100 python3 benchmarks/runs/decode_ab.py "fold=$f sleep=${ns}ns" 2>&1 | grep -v Warning
done; done | tee $OUT/decode_ab.log
