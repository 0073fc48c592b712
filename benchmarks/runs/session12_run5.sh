python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 500 python3 -m pytest -m gpu -q -rf -p no:cacheprovider tests/gpu/test_gpu_ops.py > $OUT/gpu_tests_ops.log 2>&1; tail -15 $OUT/gpu_tests_ops.log
