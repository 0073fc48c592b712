# device call 27 (session 5): call 26 was 10-15% slower on every decode row. The emitted key-loop loads as [keys, D]
# blocks vs [1, 1, keys, D] reshaped, v re-masked or not (bsp local phase); flash decode GPU tests on the new form.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 200 python3 benchmarks/decode_emit_probe.py > $OUT/decode_emit_probe.log 2>&1; cut -c1-160 $OUT/decode_emit_probe.log
timeout 150 python3 -m pytest -m gpu -q -rf tests/gpu -k "(flash_decode_on_gpu and (bf16-1 or bf16-2)) or (captured and flash)" > $OUT/gpu_tests12.txt 2>&1; tail -4 $OUT/gpu_tests12.txt
