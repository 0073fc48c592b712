python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 300 python3 benchmarks/runs/tma/premerge_probe.py > $OUT/premerge_probe.log 2>&1; tail -20 $OUT/premerge_probe.log
