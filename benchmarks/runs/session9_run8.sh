python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 400 python3 benchmarks/runs/gemm_floor_probe.py 1024 3584 8192 8192 3584 14336 > $OUT/gemm_floor_probe_3.log 2>&1
cat $OUT/gemm_floor_probe_3.log
