python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 120 python3 benchmarks/runs/epoch_probe.py > $OUT/epoch_probe.log 2>&1
cat $OUT/epoch_probe.log
