python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 400 python3 benchmarks/runs/tma/tail_bound_probe.py > $OUT/tail_bound_probe.log 2>&1; tail -30 $OUT/tail_bound_probe.log
