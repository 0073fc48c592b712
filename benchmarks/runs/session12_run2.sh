python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 580 python3 benchmarks/runs/tma/dynamic_probe.py > $OUT/dynamic_probe.log 2>&1; tail -45 $OUT/dynamic_probe.log
