python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 200 python3 benchmarks/runs/ragged/order_probe.py > $OUT/order_probe.log 2>&1; tail -40 $OUT/order_probe.log
