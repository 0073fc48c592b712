# device call 7: decode probe (what limits the persistent kernel), taxes --measure, calibrate, rest of GPU tests
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 150 python3 benchmarks/decode_probe.py > $OUT/decode_probe.log 2>&1; tail -14 $OUT/decode_probe.log
timeout 60 python3 -m tilec taxes examples/ag_gemm.tile --world 1 -D M=8192 -D N=8192 -D K=8192 --measure > $OUT/taxes_measure.log 2>&1; tail -20 $OUT/taxes_measure.log
timeout 60 python3 -m tilec calibrate > $OUT/calibrate.log 2>&1; tail -12 $OUT/calibrate.log
timeout 200 python3 -m pytest -m gpu -q -rf tests/gpu/test_gpu_examples.py -k "f16-4 or reductions" > $OUT/gpu_tests2.log 2>&1; tail -15 $OUT/gpu_tests2.log
