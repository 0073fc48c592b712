python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
for cfg in "16 8 512 512" "12 22 384 512"; do set -- $cfg
  timeout 150 python3 -m tilec taxes examples/flash_decode_splits.tile --world 1 -D B=1 -D HKV=$1 -D G=8 -D D=128 \
    -D S=8192 -D NS=$2 -D L=$3 -D BS=$4 --measure --timeline --trace $OUT/trace_h$1.json > $OUT/timeline_h$1.log 2>&1
  grep -A6 "^fused-push: call" $OUT/timeline_h$1.log
  python3 benchmarks/runs/ragged/trace_summary.py $OUT/trace_h$1.json fused-push
done
