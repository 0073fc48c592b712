python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 250 python3 benchmarks/runs/gemm_floor_probe.py 1024 3584 8192 > $OUT/gemm_probe2.log 2>&1
timeout 300 python3 benchmarks/runs/decode_stream_probe3.py > $OUT/decode_stream_probe3.log 2>&1
grep -i "error\|Trace" $OUT/*.log | head
