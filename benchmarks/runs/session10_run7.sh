python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
A="--world 1 --shapes decode-quick --schedules fused-push --iters 20"
timeout 150 python3 -m tilec bench examples/flash_decode.tile $A --out $OUT/fd_bh > $OUT/fd_bh.log 2>&1
grep -E "fused-push  |torch sdpa  " $OUT/fd_bh.log | grep -v "GB/s" | cut -c1-90; grep "BS=" $OUT/fd_bh.log | head -4
timeout 200 python3 benchmarks/runs/decode_cfg_probe.py examples/flash_decode.tile > $OUT/decode_cfg_probe.log 2>&1
tail -16 $OUT/decode_cfg_probe.log
