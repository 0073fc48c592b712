# device call 17 (session 4): flag waits over a block of counters polled at once (_tilec_wait_all) and waits
# already covered by another counter of the same producer dropped: the persistent flash decode's stage spans at
# 32K / 128K, decode-quick with the copy measured in the run and bsp's local phase alone, then the GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for sb in "32768 1024" "131072 4096"; do set -- $sb
  timeout 80 python3 -m tilec taxes examples/flash_decode.tile --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=$1 -D BS=$2 --measure --timeline > $OUT/taxes_decode_vec_$1.txt 2>&1; grep -A6 "^fused-push: call" $OUT/taxes_decode_vec_$1.txt; grep "^fused-push  " $OUT/taxes_decode_vec_$1.txt
done
timeout 150 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --schedules bsp,fused-push --iters 20 --no-tune > $OUT/bench_decode_quick.txt 2>&1; tail -12 $OUT/bench_decode_quick.txt
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-quick_bf16.$f $OUT/decode_quick.$f; done
timeout 250 python3 -m pytest -m gpu -q -rf tests/gpu -k "many_calls or (flash and (bf16-2 or f16-1)) or (ag_gemm_all and 2) or (reductions and gemm_rs-2)" > $OUT/gpu_tests7.txt 2>&1; tail -4 $OUT/gpu_tests7.txt
