# device call 12 (session 3): where a short decode call goes (timeline builds, head-major KV), and the GPU tests of
# what the remote-store change touched (gemm_rs / gemm_ar every schedule, ag_gemm and flash decode at world 2).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for sb in "32768 1024" "8192 256"; do set -- $sb
  timeout 100 python3 -m tilec taxes examples/flash_decode.tile --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=$1 -D BS=$2 --measure --timeline > $OUT/taxes_decode_$1.txt 2>&1; tail -32 $OUT/taxes_decode_$1.txt
done
timeout 300 python3 -m pytest -m gpu -q -rf tests/gpu -k "reductions or (ag_gemm_all and 2) or (flash and bf16-2)" > $OUT/gpu_tests4.txt 2>&1; tail -8 $OUT/gpu_tests4.txt
