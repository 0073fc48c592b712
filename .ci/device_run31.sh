# device call 31 (session 6): programmatic dependent launch on every kernel of serial schedules: the whole GPU
# suite (ag_gemm every schedule world 1/2, captures, flash decode, gemm_rs/ar, gpu_time), then pdl_probe.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 400 python3 -m pytest -m gpu -q -rf -x tests/gpu --durations=5 > $OUT/gpu_tests15.txt 2>&1; tail -12 $OUT/gpu_tests15.txt
timeout 150 python3 benchmarks/pdl_probe.py > $OUT/pdl_probe.log 2>&1; grep -v Warn $OUT/pdl_probe.log | cut -c1-200 | tail -40
