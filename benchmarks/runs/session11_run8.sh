python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 400 python3 benchmarks/runs/ragged/evict_probe.py > $OUT/evict_probe.log 2>&1; tail -25 $OUT/evict_probe.log
