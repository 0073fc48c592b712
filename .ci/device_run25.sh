# device call 25 (session 5): q padded inside the key loop (qlate) beside the others at 32K; then the emitted form's
# splits at 8K-1M (what default_bs weighs), split kernel alone.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 150 python3 benchmarks/decode_stream_probe.py > $OUT/decode_stream_probe2.log 2>&1; grep -E "copy|nowhere  |qlate|rror" $OUT/decode_stream_probe2.log | cut -c1-150
timeout 200 python3 benchmarks/decode_stream_probe.py --sweep > $OUT/decode_split_sweep.log 2>&1; cut -c1-150 $OUT/decode_split_sweep.log
