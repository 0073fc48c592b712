# device call 29 (session 6): what do_bench's zeroing L2 flush charges the short decode local phase (flush_probe).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 300 python3 benchmarks/flush_probe.py > $OUT/flush_probe.log 2>&1; cat $OUT/flush_probe.log | grep -v Warn | cut -c1-160
