python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
RAGGED_QUICK=1 timeout 200 python3 benchmarks/runs/ragged/ragged_probe.py > $OUT/ragged_probe3.log 2>&1; tail -12 $OUT/ragged_probe3.log
