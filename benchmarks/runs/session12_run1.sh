python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
timeout 560 python3 benchmarks/runs/tma/tma_probe.py > $OUT/tma_probe.log 2>&1; tail -40 $OUT/tma_probe.log
