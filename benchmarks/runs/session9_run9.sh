python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 300 python3 benchmarks/runs/gemm_gen_probe.py > $OUT/gemm_gen_probe.log 2>&1
cat $OUT/gemm_gen_probe.log
