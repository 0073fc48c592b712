python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
P=benchmarks/runs/tail/flash_decode_g.tile
timeout 120 python3 -m tilec taxes $P --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=8192 -D BS=512 --measure --timeline > $OUT/fdg8k_timeline.log 2>&1
grep -A12 "^fused-push: call" $OUT/fdg8k_timeline.log
timeout 400 python3 benchmarks/runs/decode_cfg_probe.py $P > $OUT/decode_cfg_probe.log 2>&1
tail -60 $OUT/decode_cfg_probe.log
