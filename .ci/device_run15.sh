# device call 15 (session 3): per-stage spans of the persistent flash decode (how fast the split stage alone
# streams the KV cache), head-major KV, launch plans.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for sb in "32768 1024" "131072 4096"; do set -- $sb
  timeout 80 python3 -m tilec taxes examples/flash_decode.tile --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=$1 -D BS=$2 --measure --timeline > $OUT/taxes_decode_span_$1.txt 2>&1; grep -A6 "^fused-push: call" $OUT/taxes_decode_span_$1.txt
done
