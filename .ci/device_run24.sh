# device call 24 (session 5): what the split kernel's per-block work costs (v re-mask, eviction hint, TMA, warps).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 280 python3 benchmarks/decode_stream_probe.py > $OUT/decode_stream_probe.log 2>&1; cut -c1-160 $OUT/decode_stream_probe.log
