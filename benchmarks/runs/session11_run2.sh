python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 200 python3 benchmarks/runs/ragged/placement_probe.py > $OUT/placement_probe.log 2>&1; tail -20 $OUT/placement_probe.log
timeout 200 python3 benchmarks/runs/ragged/ragged_probe.py > $OUT/ragged_probe2.log 2>&1; tail -30 $OUT/ragged_probe2.log
